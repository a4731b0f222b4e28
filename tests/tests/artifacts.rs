//! `task.artifacts`, black-box: a real master, agent and executors (as root), tasks
//! as `www-data`, artifacts served by a tiny HTTP server in this test that counts
//! requests per path. One cluster for every scenario (they run one after another):
//! a tarball and a file (after a 503: retried) fetched, verified, unpacked as the
//! task user and used;
//! `file://` read as the task user; a checksum mismatch, a 404 and an artifact over
//! `artifact_max_size` failing the task with `artifact_fetch_failed`; hostile
//! archives (tar-slip, absolute path, symlink escape directly and through another
//! link, device node, setuid) refused with canaries outside the sandbox unchanged;
//! zip and tar.zst archives unpacked; a cached archive's unpacked tree shared by
//! hard links, read-only: a task that cannot write or chmod its files replaces
//! one, the next task's files, the tree and the cache unchanged; hostile zips refused
//! like the tars, with nothing left in the cache's trees; fifty instances sharing one artifact fetching it once; eviction
//! from a 1 KiB cache, never of a tree a running task uses; the
//! fetch's progress in the STARTING status; a kill while a download hangs; an agent
//! crash during a download, with a re-adopted task's artifact kept in the cache.

#![allow(clippy::unwrap_used)] // unwrap is how tests fail

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex};

use drover_common::state::{ExitReason, TaskState};
use drover_common::wire::TaskView;
use drover_tests::{command_job, running_as_root, Cluster, ClusterConfig, WAIT};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// Files served by path, and how often each path was asked for.
#[derive(Default)]
struct Served {
    files: HashMap<String, Vec<u8>>,
    hits: HashMap<String, usize>,
    /// Paths whose first request gets half the body, then nothing for 20 s.
    stall_first: Vec<String>,
    /// Paths whose first request gets a 503.
    fail_first: Vec<String>,
    /// Paths whose body is sent in 16 pieces with this pause before each.
    trickle: HashMap<String, std::time::Duration>,
}

/// The head of a 200 answer with a body of `len` bytes.
fn ok_head(len: usize) -> String {
    format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n")
}

/// Serves `served` over HTTP/1.1 (one request per connection) on 127.0.0.1;
/// returns the base URL. The thread lives as long as the test process.
fn serve(served: Arc<Mutex<Served>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let served = served.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut first = String::new();
                if reader.read_line(&mut first).is_err() {
                    return;
                }
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                }
                let path = first.split_whitespace().nth(1).unwrap_or("/").to_string();
                let (body, stall) = {
                    let mut s = served.lock().unwrap();
                    let hits = s.hits.entry(path.clone()).or_default();
                    *hits += 1;
                    let first = *hits == 1;
                    let stall = first && s.stall_first.contains(&path);
                    if first && s.fail_first.contains(&path) {
                        drop(s);
                        let _ = stream.write_all(
                            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                        );
                        return;
                    }
                    let pause = s.trickle.get(&path).copied();
                    if let (Some(body), Some(pause)) = (s.files.get(&path).cloned(), pause) {
                        drop(s);
                        if stream.write_all(ok_head(body.len()).as_bytes()).is_err() {
                            return;
                        }
                        for piece in body.chunks(body.len().div_ceil(16).max(1)) {
                            std::thread::sleep(pause);
                            if stream.write_all(piece).is_err() {
                                return;
                            }
                        }
                        return;
                    }
                    (s.files.get(&path).cloned(), stall)
                };
                if let (Some(body), true) = (&body, stall) {
                    let _ = stream
                        .write_all(ok_head(body.len()).as_bytes())
                        .and_then(|()| stream.write_all(&body[..body.len() / 2]));
                    std::thread::sleep(std::time::Duration::from_secs(20));
                    return;
                }
                let _ = match body {
                    Some(body) => stream
                        .write_all(ok_head(body.len()).as_bytes())
                        .and_then(|()| stream.write_all(&body)),
                    None => stream.write_all(
                        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    ),
                };
            });
        }
    });
    format!("http://{addr}")
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One tar member: raw name (not validated, so hostile ones can be written), type,
/// mode, link target, content.
struct Raw<'a> {
    name: &'a str,
    kind: tar::EntryType,
    mode: u32,
    link: Option<&'a str>,
    data: &'a [u8],
}

fn file<'a>(name: &'a str, mode: u32, data: &'a [u8]) -> Raw<'a> {
    Raw {
        name,
        kind: tar::EntryType::Regular,
        mode,
        link: None,
        data,
    }
}

fn symlink<'a>(name: &'a str, target: &'a str) -> Raw<'a> {
    Raw {
        name,
        kind: tar::EntryType::Symlink,
        mode: 0o777,
        link: Some(target),
        data: b"",
    }
}

/// Serves `body` at `path`.
fn put(served: &Mutex<Served>, path: &str, body: &[u8]) {
    served
        .lock()
        .unwrap()
        .files
        .insert(path.to_string(), body.to_vec());
}

/// A tar archive of `members`, gzipped when `gz`.
fn tarball(members: &[Raw<'_>], gz: bool) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for m in members {
        let mut header = tar::Header::new_gnu();
        let old = header.as_old_mut();
        old.name[..m.name.len()].copy_from_slice(m.name.as_bytes());
        if let Some(link) = m.link {
            old.linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        header.set_entry_type(m.kind);
        header.set_mode(m.mode);
        header.set_size(m.data.len() as u64);
        if m.kind == tar::EntryType::Char {
            header.set_device_major(1).unwrap();
            header.set_device_minor(3).unwrap();
        }
        header.set_cksum();
        builder.append(&header, m.data).unwrap();
    }
    let tar = builder.into_inner().unwrap();
    if !gz {
        return tar;
    }
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(&tar).unwrap();
    enc.finish().unwrap()
}

/// A zip archive (deflated) of `(name, Unix mode with file type, content)`; the
/// names and modes are not checked, so hostile ones can be written.
fn zip_of(members: &[(&str, u32, &[u8])]) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, mode, data) in members {
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .external_attributes(mode << 16);
        w.start_file(*name, opts).unwrap();
        w.write_all(data).unwrap();
    }
    w.finish().unwrap().into_inner()
}

/// A one-shot job running `cmdline` with `artifacts`.
fn job(name: &str, instances: u32, cmdline: &str, artifacts: Value) -> Value {
    let mut spec = command_job(name, instances, false, cmdline);
    spec["task"]["artifacts"] = artifacts;
    spec
}

/// The ended task of every instance of `key`.
fn ended(cluster: &mut Cluster, key: &str) -> Vec<TaskView> {
    let key = key.to_string();
    cluster
        .wait_for(&format!("{key} to end"), WAIT, move |c| {
            let view = c.job(&key).ok()?;
            let tasks: Vec<TaskView> = view
                .instances
                .iter()
                .filter_map(|i| {
                    i.current
                        .iter()
                        .chain(i.history.iter())
                        .find(|t| t.state.is_terminal())
                        .cloned()
                })
                .collect();
            (!view.instances.is_empty() && tasks.len() == view.instances.len()).then_some(tasks)
        })
        .unwrap()
}

/// Runs `spec` and returns its one task once ended.
fn run(cluster: &mut Cluster, spec: &Value) -> TaskView {
    cluster.create_job(spec).unwrap();
    let key = format!("www-data/test/{}", spec["name"].as_str().unwrap());
    let task = ended(cluster, &key).remove(0);
    let _ = cluster.kill_job(&key);
    task
}

/// The `artifact_fetch_failed` of a task that must have failed with it.
fn fetch_failure(task: &TaskView) -> (String, String) {
    assert_eq!(task.state, TaskState::Failed, "{task:?}");
    match &task.exit_reason {
        Some(ExitReason::ArtifactFetchFailed { url, error }) => (url.clone(), error.clone()),
        other => panic!("expected artifact_fetch_failed, got {other:?}"),
    }
}

/// Every name below `dir` with its size and mode, sorted.
fn listing(dir: &Path) -> Vec<(String, u64, u32)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let meta = std::fs::symlink_metadata(e.path()).unwrap();
            out.push((e.path().display().to_string(), meta.len(), meta.mode()));
            if meta.is_dir() {
                stack.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// Instances of one job sharing an artifact (the issue asks for 50).
const SHARING: u32 = 50;

#[test]
fn artifacts_are_fetched_verified_unpacked_shared_and_hostile_ones_refused() {
    if !running_as_root("artifacts") {
        return;
    }
    let served = Arc::new(Mutex::new(Served::default()));
    let base = serve(served.clone());
    let mut config = ClusterConfig::agents(1);
    // A cache of 1 KiB: every hostile archive (10 KiB of tar) evicts what came before.
    config.agent_config =
        "artifact_max_size = \"1MiB\"\nartifact_cache_size = \"1KiB\"\n".to_string();
    let mut cluster = Cluster::start(config).unwrap();
    let www = nix::unistd::User::from_name("www-data").unwrap().unwrap();

    // Canaries outside every sandbox: `<cluster>/canary/file`.
    let canary = cluster.dir().join("canary");
    std::fs::create_dir_all(&canary).unwrap();
    std::fs::write(canary.join("file"), "canary\n").unwrap();
    std::fs::write(canary.join("secret"), "secret\n").unwrap();
    std::fs::set_permissions(canary.join("secret"), PermissionsExt::from_mode(0o600)).unwrap();
    let public = cluster.dir().join("public.txt");
    std::fs::write(&public, "public").unwrap();
    std::fs::set_permissions(&public, PermissionsExt::from_mode(0o644)).unwrap();
    let canaries_before = listing(&canary);
    let outside_before = listing(&cluster.dir().join("sandboxes"));
    assert!(outside_before.iter().all(|(p, ..)| !p.contains("canary")));

    let app = tarball(
        &[
            file("app/run.sh", 0o755, b"#!/bin/sh\necho ran\n"),
            file("app/data.txt", 0o644, b"hello"),
        ],
        true,
    );
    let tool = b"#!/bin/sh\necho tool\n".to_vec();
    let big = vec![7u8; 2 << 20];
    {
        let mut s = served.lock().unwrap();
        s.files.insert("/app.tar.gz".into(), app.clone());
        s.files.insert("/tool".into(), tool.clone());
        s.files.insert("/big.bin".into(), big.clone());
        s.fail_first.push("/tool".into());
    }
    let shared = tarball(
        &[
            file("app/run.sh", 0o755, b"#!/bin/sh\necho ran\n"),
            file("app/other.txt", 0o644, b"shared"),
        ],
        true,
    );
    put(&served, "/shared.tar.gz", &shared);

    // A tarball and an executable file, used by the task.
    let good = run(
        &mut cluster,
        &job(
            "good",
            1,
            "test \"$(./app/run.sh)\" = ran && test \"$(cat app/data.txt)\" = hello && test \"$(bin/tool)\" = tool",
            json!([
                {"url": format!("{base}/app.tar.gz"), "sha256": sha256(&app)},
                {"url": format!("{base}/tool"), "sha256": sha256(&tool), "dest": "bin/tool", "executable": true}
            ]),
        ),
    );
    assert_eq!(good.state, TaskState::Finished, "{good:?}");
    // The archive's files are hard links to the cache's unpacked tree (root's,
    // read-only), its directories the task user's; the single file a copy of the
    // task user's with the mode asked for.
    let sandbox = cluster.sandbox_of(&good.task_id).unwrap().join("sandbox");
    let trees = cluster.dir().join("agent-0/artifacts/trees");
    let app_tree = trees.join(format!("{}.tar.gz", sha256(&app)));
    for (f, mode) in [("app/run.sh", 0o555), ("app/data.txt", 0o444)] {
        let meta = std::fs::metadata(sandbox.join(f)).unwrap();
        let cached = std::fs::metadata(app_tree.join(f)).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, mode), "{f}");
        assert_eq!(meta.ino(), cached.ino(), "{f} is the tree's");
    }
    assert_eq!(
        std::fs::metadata(sandbox.join("app")).unwrap().uid(),
        www.uid.as_raw()
    );
    let tool_meta = std::fs::metadata(sandbox.join("bin/tool")).unwrap();
    assert_eq!(
        (tool_meta.uid(), tool_meta.mode() & 0o777),
        (www.uid.as_raw(), 0o755)
    );
    // The first answer for the tool was a 503: retried once.
    assert_eq!(served.lock().unwrap().hits.get("/tool"), Some(&2));

    // A zip (modes and an inner link kept) and a tar.zst, unpacked by their names.
    let zipped = zip_of(&[
        ("app2/run.sh", 0o100_755, b"#!/bin/sh\necho zipped\n"),
        ("app2/link", 0o120_777, b"run.sh"),
    ]);
    let zst = zstd::stream::encode_all(
        &tarball(&[file("zst/data.txt", 0o644, b"zstd")], false)[..],
        3,
    )
    .unwrap();
    put(&served, "/formats.zip", &zipped);
    put(&served, "/formats.tar.zst", &zst);
    let formats = run(
        &mut cluster,
        &job(
            "formats",
            1,
            "test \"$(./app2/run.sh)\" = zipped && test \"$(./app2/link)\" = zipped && test \"$(cat zst/data.txt)\" = zstd",
            json!([
                {"url": format!("{base}/formats.zip"), "sha256": sha256(&zipped)},
                {"url": format!("{base}/formats.tar.zst"), "sha256": sha256(&zst)}
            ]),
        ),
    );
    assert_eq!(formats.state, TaskState::Finished, "{formats:?}");
    let sandbox = cluster
        .sandbox_of(&formats.task_id)
        .unwrap()
        .join("sandbox");
    for (f, tree) in [
        ("app2/run.sh", format!("{}.zip", sha256(&zipped))),
        ("zst/data.txt", format!("{}.tar.zst", sha256(&zst))),
    ] {
        let meta = std::fs::metadata(sandbox.join(f)).unwrap();
        let cached = std::fs::metadata(trees.join(tree).join(f)).unwrap();
        assert_eq!((meta.uid(), meta.ino()), (0, cached.ino()), "{f}");
    }
    assert_eq!(
        std::fs::symlink_metadata(sandbox.join("app2/link"))
            .unwrap()
            .uid(),
        www.uid.as_raw()
    );

    // A cached archive's unpacked tree is shared by hard links, read-only: two
    // tasks at once can neither write nor chmod their files (they may replace
    // them: the directories are theirs), and what one does changes neither the
    // other's files, the next task's, the tree nor the cached archive.
    let plain = tarball(
        &[
            file("plain/data.txt", 0o644, b"pristine"),
            file("plain/run.sh", 0o755, b"#!/bin/sh\necho plain\n"),
        ],
        false,
    );
    put(&served, "/plain.tar", &plain);
    let plain_artifact = json!([{"url": format!("{base}/plain.tar"), "sha256": sha256(&plain)}]);
    let key = "www-data/test/vandal";
    cluster
        .create_job(&job(
            "vandal",
            2,
            "test \"$(cat plain/data.txt)\" = pristine \
             && ! (echo changed > plain/data.txt) 2>/dev/null \
             && ! (echo x >> plain/run.sh) 2>/dev/null \
             && ! chmod 600 plain/run.sh 2>/dev/null \
             && rm plain/data.txt && echo \"changed $(cat /proc/sys/kernel/random/uuid)\" > plain/data.txt && mkdir plain/new",
            plain_artifact.clone(),
        ))
        .unwrap();
    let vandals = ended(&mut cluster, key);
    let _ = cluster.kill_job(key);
    let mut changed = Vec::new();
    for v in &vandals {
        assert_eq!(v.state, TaskState::Finished, "{v:?}");
        let dir = cluster
            .sandbox_of(&v.task_id)
            .unwrap()
            .join("sandbox/plain");
        changed.push(std::fs::read_to_string(dir.join("data.txt")).unwrap());
    }
    assert!(
        changed[0] != changed[1] && changed.iter().all(|c| c.starts_with("changed ")),
        "{changed:?}"
    );
    let next = run(
        &mut cluster,
        &job(
            "after-vandal",
            1,
            "test \"$(cat plain/data.txt)\" = pristine && test \"$(./plain/run.sh)\" = plain && test ! -e plain/new",
            plain_artifact,
        ),
    );
    assert_eq!(next.state, TaskState::Finished, "{next:?}");
    let next_box = cluster
        .sandbox_of(&next.task_id)
        .unwrap()
        .join("sandbox/plain");
    let plain_tree = trees.join(format!("{}.tar", sha256(&plain))).join("plain");
    for (f, content, mode) in [
        ("run.sh", &b"#!/bin/sh\necho plain\n"[..], 0o555),
        ("data.txt", &b"pristine"[..], 0o444),
    ] {
        assert_eq!(std::fs::read(next_box.join(f)).unwrap(), content, "{f}");
        let tree_meta = std::fs::metadata(plain_tree.join(f)).unwrap();
        assert_eq!(std::fs::read(plain_tree.join(f)).unwrap(), content, "{f}");
        assert_eq!(
            (tree_meta.uid(), tree_meta.mode() & 0o7777),
            (0, mode),
            "{f}"
        );
    }
    // All from one download, and the cached file is still the artifact.
    assert_eq!(served.lock().unwrap().hits.get("/plain.tar"), Some(&1));
    let cached = cluster.dir().join("agent-0/artifacts").join(sha256(&plain));
    assert_eq!(std::fs::read(cached).unwrap(), plain);

    // file:// is read as the task user: a readable file is copied (and verified),
    // root's secret is not.
    let local = run(
        &mut cluster,
        &job(
            "local",
            1,
            "test \"$(cat conf/public.txt)\" = public",
            json!([{"url": format!("file://{}", public.display()), "sha256": sha256(b"public"), "dest": "conf/public.txt"}]),
        ),
    );
    assert_eq!(local.state, TaskState::Finished, "{local:?}");
    let (_, error) = fetch_failure(&run(
        &mut cluster,
        &job(
            "secret",
            1,
            "true",
            json!([{"url": format!("file://{}", canary.join("secret").display())}]),
        ),
    ));
    assert!(error.contains("ermission denied"), "{error}");

    // A checksum mismatch names both sums.
    let wrong = "0".repeat(64);
    let (url, error) = fetch_failure(&run(
        &mut cluster,
        &job(
            "mismatch",
            1,
            "true",
            json!([{"url": format!("{base}/tool"), "sha256": wrong}]),
        ),
    ));
    assert!(url.ends_with("/tool"), "{url}");
    assert!(
        error.contains("checksum mismatch")
            && error.contains(&wrong)
            && error.contains(&sha256(&tool)),
        "{error}"
    );

    // A 404 names the status, and is not retried.
    let (_, error) = fetch_failure(&run(
        &mut cluster,
        &job(
            "missing",
            1,
            "true",
            json!([{"url": format!("{base}/nope.tar"), "sha256": sha256(b"")}]),
        ),
    ));
    assert!(error.contains("404"), "{error}");
    assert_eq!(served.lock().unwrap().hits.get("/nope.tar"), Some(&1));

    // Over artifact_max_size.
    let (_, error) = fetch_failure(&run(
        &mut cluster,
        &job(
            "big",
            1,
            "true",
            json!([{"url": format!("{base}/big.bin"), "sha256": sha256(&big)}]),
        ),
    ));
    assert!(error.contains("too large"), "{error}");

    // Hostile archives: each refused, nothing outside the sandbox changes.
    let canary_dir = canary.display().to_string();
    let slip_path = "../../../../canary/file".to_string();
    let abs_path = format!("{canary_dir}/abs");
    let hostile: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "zip-slip",
            zip_of(&[(&slip_path, 0o100_644, b"pwned\n")]),
            "..",
        ),
        (
            "zip-absolute",
            zip_of(&[(&abs_path, 0o100_644, b"pwned\n")]),
            "absolute",
        ),
        (
            "zip-symlink",
            zip_of(&[
                ("esc", 0o120_777, canary_dir.as_bytes()),
                ("esc/file", 0o100_644, b"pwned\n"),
            ]),
            "outside",
        ),
        (
            "zip-chain",
            zip_of(&[("a", 0o120_777, b"."), ("sub/b", 0o120_777, b"../a/..")]),
            "through another link",
        ),
        ("zip-device", zip_of(&[("null2", 0o020_666, b"")]), "device"),
        (
            "zip-setuid",
            zip_of(&[("sh", 0o104_755, b"#!/bin/sh\n")]),
            "setuid",
        ),
        (
            "slip",
            tarball(&[file(&slip_path, 0o644, b"pwned\n")], false),
            "..",
        ),
        (
            "absolute",
            tarball(&[file(&abs_path, 0o644, b"pwned\n")], false),
            "absolute",
        ),
        (
            "symlink",
            tarball(
                &[
                    symlink("esc", &canary_dir),
                    file("esc/file", 0o644, b"pwned\n"),
                ],
                false,
            ),
            "outside",
        ),
        (
            "chain",
            tarball(&[symlink("a", "."), symlink("b", "a/..")], false),
            "through another link",
        ),
        (
            "device",
            tarball(
                &[Raw {
                    name: "null2",
                    kind: tar::EntryType::Char,
                    mode: 0o666,
                    link: None,
                    data: b"",
                }],
                false,
            ),
            "device",
        ),
        (
            "setuid",
            tarball(&[file("sh", 0o4755, b"#!/bin/sh\n")], false),
            "setuid",
        ),
    ];
    for (name, archive, word) in hostile {
        let ext = if name.starts_with("zip-") {
            "zip"
        } else {
            "tar"
        };
        let path = format!("/{name}.{ext}");
        put(&served, &path, &archive);
        let task = run(
            &mut cluster,
            &job(
                name,
                1,
                "true",
                json!([{"url": format!("{base}{path}"), "sha256": sha256(&archive), "extract": "auto"}]),
            ),
        );
        let (_, error) = fetch_failure(&task);
        assert!(
            error.contains("unpack refused") && error.contains(word),
            "{name}: {error}"
        );
        assert_eq!(
            listing(&canary),
            canaries_before,
            "{name} changed the canaries"
        );
        assert_eq!(
            std::fs::read_to_string(canary.join("file")).unwrap(),
            "canary\n"
        );
        // Refused while unpacked into the cache: nothing was placed in the
        // sandbox, and no tree (nor its staging) is left.
        let sandbox = cluster.sandbox_of(&task.task_id).unwrap().join("sandbox");
        assert_eq!(listing(&sandbox), vec![], "{name}");
        let left: Vec<_> = std::fs::read_dir(&trees)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&sha256(&archive)) || n.starts_with(".staging"))
            .collect();
        assert!(left.is_empty(), "{name}: {left:?}");
    }

    // Fifty instances starting together (the download trickles, so that they all
    // wait for it) fetch their shared artifact once.
    let key = "www-data/test/shared";
    served.lock().unwrap().trickle.insert(
        "/shared.tar.gz".into(),
        std::time::Duration::from_millis(100),
    );
    let mut spec = job(
        "shared",
        SHARING,
        "test \"$(./app/run.sh)\" = ran",
        json!([{"url": format!("{base}/shared.tar.gz"), "sha256": sha256(&shared)}]),
    );
    spec["task"]["resources"] = json!({"cpu": 0.05, "ram": "16MiB", "disk": "16MiB"});
    cluster.create_job(&spec).unwrap();
    let tasks = ended(&mut cluster, key);
    assert_eq!(tasks.len(), SHARING as usize);
    assert!(
        tasks.iter().all(|t| t.state == TaskState::Finished),
        "{tasks:?}"
    );
    assert_eq!(served.lock().unwrap().hits.get("/shared.tar.gz"), Some(&1));
    assert_eq!(served.lock().unwrap().hits.get("/app.tar.gz"), Some(&1));
    let _ = cluster.kill_job(key);

    // The hostile archives evicted app.tar.gz from the 1 KiB cache: fetched again,
    // and what stays is the two most recently used, with their unpacked trees
    // (those of the evicted ones deleted with them).
    let again = run(
        &mut cluster,
        &job(
            "again",
            1,
            "./app/run.sh",
            json!([{"url": format!("{base}/app.tar.gz"), "sha256": sha256(&app)}]),
        ),
    );
    assert_eq!(again.state, TaskState::Finished, "{again:?}");
    assert_eq!(served.lock().unwrap().hits.get("/app.tar.gz"), Some(&2));
    let names = |dir: &Path| {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let mut expected = vec![sha256(&app), sha256(&shared), "trees".to_string()];
    expected.sort();
    assert_eq!(names(&cluster.dir().join("agent-0/artifacts")), expected);
    let mut expected = vec![
        format!("{}.tar.gz", sha256(&app)),
        format!("{}.tar.gz", sha256(&shared)),
    ];
    expected.sort();
    assert_eq!(names(&trees), expected);

    // While a download runs, the task is STARTING and its status says how far it
    // got (the agent's statuses, numbered before the executor's).
    let progress = vec![b'p'; 256 << 10];
    {
        let mut s = served.lock().unwrap();
        s.files.insert("/progress.bin".into(), progress.clone());
        s.trickle.insert(
            "/progress.bin".into(),
            std::time::Duration::from_millis(300),
        );
    }
    let key = "www-data/test/progress";
    cluster
        .create_job(&job(
            "progress",
            1,
            "test -s progress.bin",
            json!([{"url": format!("{base}/progress.bin"), "sha256": sha256(&progress)}]),
        ))
        .unwrap();
    let message = cluster
        .wait_for("a STARTING status with the fetch's progress", WAIT, |c| {
            let view = c.job(key).ok()?;
            let task = view.instances.first()?.current.clone()?;
            let last = task.events.last()?;
            (task.state == TaskState::Starting
                && last.message.starts_with("fetching 1 of 1 (")
                && last.message.ends_with(" of 256 KiB)"))
            .then(|| last.message.clone())
        })
        .unwrap();
    let task = ended(&mut cluster, key).remove(0);
    assert_eq!(task.state, TaskState::Finished, "{task:?} after {message}");
    let states: Vec<TaskState> = task.events.iter().map(|e| e.state).collect();
    assert!(
        states
            .windows(3)
            .any(|w| w == [TaskState::Assigned, TaskState::Starting, TaskState::Running]),
        "{:?}",
        task.events
    );
    let _ = cluster.kill_job(key);

    // A kill while the download hangs ends the task KILLED at once.
    let hung = tarball(&[file("x", 0o644, &[b'x'; 64 << 10])], false);
    {
        let mut s = served.lock().unwrap();
        s.files.insert("/hung.tar".into(), hung.clone());
        s.stall_first.push("/hung.tar".into());
    }
    let key = "www-data/test/hung";
    cluster
        .create_job(&job(
            "hung",
            1,
            "true",
            json!([{"url": format!("{base}/hung.tar"), "sha256": sha256(&hung)}]),
        ))
        .unwrap();
    let hung_part = cluster
        .dir()
        .join(format!("agent-0/artifacts/{}.part", sha256(&hung)));
    cluster
        .wait_for("the hung download to start", WAIT, |_| {
            hung_part.exists().then_some(())
        })
        .unwrap();
    let asked = std::time::Instant::now();
    cluster.kill_job(key).unwrap();
    let killed = ended(&mut cluster, key).remove(0);
    assert_eq!(killed.state, TaskState::Killed, "{killed:?}");
    assert!(asked.elapsed() < std::time::Duration::from_secs(10));

    // A running task whose artifacts are cached (a file, and an archive with its
    // unpacked tree): another task's download evicts neither, and re-adopted after
    // the agent's restart below, its artifact stays pinned (the 1 KiB cache would
    // evict it at the replacement's download otherwise).
    let kept = b"kept artifact\n".to_vec();
    put(&served, "/kept.txt", &kept);
    let kept_tar = tarball(&[file("kept/data", 0o644, b"kept tree")], false);
    put(&served, "/kept.tar", &kept_tar);
    let keep_key = "www-data/test/keep";
    let mut keep = command_job("keep", 1, true, "exec sleep 600");
    // (The archive first: one after a copied artifact is copied too.)
    keep["task"]["artifacts"] = json!([
        {"url": format!("{base}/kept.tar"), "sha256": sha256(&kept_tar)},
        {"url": format!("{base}/kept.txt"), "sha256": sha256(&kept)}
    ]);
    cluster.create_job(&keep).unwrap();
    cluster.wait_for_all(keep_key, TaskState::Running).unwrap();
    let kept_file = cluster
        .dir()
        .join(format!("agent-0/artifacts/{}", sha256(&kept)));
    assert!(kept_file.exists());
    let kept_tree = trees.join(format!("{}.tar", sha256(&kept_tar)));
    let keeper_id = cluster.job(keep_key).unwrap().instances[0]
        .current
        .as_ref()
        .unwrap()
        .task_id
        .clone();
    let keeper_data = cluster
        .sandbox_of(&keeper_id)
        .unwrap()
        .join("sandbox/kept/data");
    let evictor = tarball(&[file("e", 0o644, &[b'e'; 4 << 10])], false);
    put(&served, "/evictor.tar", &evictor);
    let evicting = run(
        &mut cluster,
        &job(
            "evictor",
            1,
            "test -s e",
            json!([{"url": format!("{base}/evictor.tar"), "sha256": sha256(&evictor)}]),
        ),
    );
    assert_eq!(evicting.state, TaskState::Finished, "{evicting:?}");
    assert!(
        kept_tree.join("kept/data").exists(),
        "a tree in use was evicted"
    );
    assert_eq!(
        std::fs::metadata(&keeper_data).unwrap().ino(),
        std::fs::metadata(kept_tree.join("kept/data"))
            .unwrap()
            .ino()
    );

    // The agent crashes during a download: the task is LOST, the unfinished
    // download is deleted when the agent starts again, and the replacement fetches
    // the artifact whole.
    let slow = tarball(&[file("app/run.sh", 0o755, &[b'#'; 64 << 10])], false);
    {
        let mut s = served.lock().unwrap();
        s.files.insert("/slow.tar".into(), slow.clone());
        s.stall_first.push("/slow.tar".into());
    }
    let key = "www-data/test/slow";
    cluster
        .create_job(&job(
            "slow",
            1,
            "test -s app/run.sh",
            json!([{"url": format!("{base}/slow.tar"), "sha256": sha256(&slow)}]),
        ))
        .unwrap();
    let part = cluster
        .dir()
        .join(format!("agent-0/artifacts/{}.part", sha256(&slow)));
    cluster
        .wait_for("the download to start", WAIT, |_| {
            part.exists().then_some(())
        })
        .unwrap();
    cluster.kill_agent(0);
    cluster.start_agent_again(0).unwrap();
    let view = cluster
        .wait_for("the replacement to finish", WAIT, |c| {
            let view = c.job(key).ok()?;
            let i = view.instances.first()?;
            i.current
                .as_ref()
                .is_some_and(|t| t.state == TaskState::Finished)
                .then_some(view)
        })
        .unwrap();
    let first = &view.instances[0].history;
    assert!(
        first.iter().any(|t| t.state == TaskState::Lost),
        "{first:?}"
    );
    assert!(!part.exists());
    assert_eq!(served.lock().unwrap().hits.get("/slow.tar"), Some(&2));
    let _ = cluster.kill_job(key);
    // The re-adopted task still runs, and its artifact was not evicted.
    let view = cluster.job(keep_key).unwrap();
    let keeper = view.instances[0].current.as_ref().unwrap();
    assert_eq!(keeper.state, TaskState::Running, "{keeper:?}");
    assert!(
        kept_file.exists(),
        "the re-adopted task's artifact was evicted"
    );
    // Trees are not kept across restarts; the task's links to the files are.
    assert!(!kept_tree.exists());
    assert_eq!(std::fs::read(&keeper_data).unwrap(), b"kept tree");
    cluster.kill_job(keep_key).unwrap();
    ended(&mut cluster, keep_key);
}
