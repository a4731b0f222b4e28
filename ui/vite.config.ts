// Builds the web UI into dist/ with fixed file names: the master embeds
// dist/index.html, dist/assets/app.js and dist/assets/app.css (master/src/ui.rs),
// so the names must not change between builds.
import { defineConfig } from "vite";

export default defineConfig({
  base: "/ui/",
  build: {
    outDir: "dist",
    emptyOutDir: true,
    target: "es2022",
    modulePreload: false,
    reportCompressedSize: false,
    rollupOptions: {
      output: {
        entryFileNames: "assets/app.js",
        chunkFileNames: "assets/[name].js",
        assetFileNames: "assets/app[extname]",
      },
    },
  },
});
