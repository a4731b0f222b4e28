// The master's JSON types the UI reads (common/src/wire.rs, docs/api.md); only the
// fields the pages use.

export type TaskState =
  | "PENDING" | "THROTTLED" | "ASSIGNED" | "STARTING" | "RUNNING" | "FINISHED"
  | "FAILED" | "KILLING" | "KILLED" | "RESTARTING" | "PREEMPTING" | "DRAINING"
  | "LOST";

/** Every state in lifecycle order (common/src/state.rs ALL_STATES). */
export const ALL_STATES: TaskState[] = [
  "PENDING", "THROTTLED", "ASSIGNED", "STARTING", "RUNNING", "FINISHED", "FAILED",
  "KILLING", "KILLED", "RESTARTING", "PREEMPTING", "DRAINING", "LOST",
];

/** States nothing leaves. */
export const TERMINAL: ReadonlySet<string> = new Set(["FINISHED", "FAILED", "KILLED", "LOST"]);
/** States of a task waiting for a host. */
export const WAITING: ReadonlySet<string> = new Set(["PENDING", "THROTTLED"]);

export type StateCounts = Partial<Record<TaskState, number>>;

export interface ExitReason {
  kind: string;
  code?: number;
  signal?: number;
  [field: string]: unknown;
}

export interface TaskEvent {
  timestamp_ms: number;
  state: TaskState;
  source: string;
  message: string;
}

export interface ProcessStatus {
  name: string;
  state: string;
  pid: number | null;
  runs: number;
  failures: number;
  last_exit: ExitReason | null;
}

export interface TaskView {
  task_id: string;
  job: string;
  instance: number;
  state: TaskState;
  desired: string;
  exit_reason: ExitReason | null;
  agent_id: string | null;
  ports: Record<string, number>;
  pending_reason: string | null;
  preempted_by?: string;
  events: TaskEvent[];
  processes: ProcessStatus[];
}

export interface CronView {
  job: string;
  schedule: string;
  timezone: string;
  next_fire_ms: number | null;
  last_fired_ms: number | null;
  active_tasks: number;
}

export interface JobSummary {
  key: string;
  instances: number;
  service: boolean;
  state_counts: StateCounts;
  tier: string;
  priority: number;
  cron?: CronView;
  /** While some instance is PENDING: why the job's pending tasks are not placed. */
  pending_reason?: string;
}

export interface InstanceView {
  instance: number;
  config: string | null;
  current: TaskView | null;
  history: TaskView[];
}

export interface UpdateView {
  id: string;
  job: string;
  user: string;
  created_ms: number;
  state: string;
  to_config: string;
  instances_before: number;
  instances_after: number;
  instances: { instance: number; from: string | null; to: string | null; state: string; failures: number }[];
  events: { at_ms: number; message: string }[];
  /** While it runs: what it waits for (with the scheduler's reason for PENDING instances). */
  waiting?: string | null;
  /** While it runs: why it cannot finish as things stand. */
  stuck?: string | null;
}

export interface JobView {
  key: string;
  spec: Record<string, unknown>;
  created_ms: number;
  state_counts: StateCounts;
  /** Every instance of the job, whatever the page. */
  instance_count: number;
  /** Instances per config hash (the whole job). */
  config_counts: Record<string, number>;
  /** The page asked for (`limit`, `after`, `state`). */
  instances: InstanceView[];
  /** More instances match after this page: pass it as `after`. */
  next_after?: number;
  /** The job's latest task events, newest first (at most 50). */
  recent_events: { task_id: string; instance: number; event: TaskEvent }[];
  cron?: CronView;
  configs: Record<string, Record<string, unknown>>;
  update: UpdateView | null;
  /** A user a live task (or the cron template) runs as that the role is no longer granted. */
  ungranted_user?: string;
}

export interface Resources {
  cpu: number;
  ram_bytes: number;
  disk_bytes: number;
  port_range: [number, number];
}

export type MaintenanceMode = "NONE" | "SCHEDULED" | "DRAINING" | "DRAINED";

export interface AgentView {
  agent_id: string;
  hostname: string;
  address: string;
  reachable: boolean;
  last_heartbeat_ms: number;
  attributes: Record<string, string>;
  resources: Resources;
  free: Resources;
  tasks: string[];
  maintenance: MaintenanceMode;
}

export interface HostView {
  agent_id: string;
  hostname: string;
  reachable: boolean;
  mode: MaintenanceMode;
  reason: string | null;
  since_ms: number;
  deadline_ms: number | null;
  tasks_left: number;
  blocked: string[];
  /** While DRAINING: why the drain cannot go on as things stand. */
  stuck?: string | null;
  events: { timestamp_ms: number; message: string }[];
}

export interface Capacity {
  cpu: number;
  ram_bytes: number;
  disk_bytes: number;
}

export interface ClusterView {
  agents: number;
  reachable_agents: number;
  eviction_guard: { engaged: boolean; message: string; held_tasks: number };
  /** Agents per maintenance mode. */
  maintenance: Record<string, number>;
  /** What the agents offer, summed, and what of it is free. */
  capacity: Capacity;
  free: Capacity;
}

export interface ChangesView {
  index: number;
  /** The answer is one page (`limit`): ask again with `index` and `after`. */
  more?: boolean;
  after?: string;
  /** The master's last committed index when read. */
  head: number;
  reset: boolean;
  tasks: TaskView[];
  jobs: JobSummary[];
  agents: AgentView[];
  updates?: UpdateView[];
}

export interface ApiErrorBody {
  error: { code: string; message: string; field?: string | null };
}

/** One announced instance (wire.rs ServiceEndpoint). */
export interface ServiceEndpoint {
  instance: number;
  host: string;
  ip: string;
  ports: Record<string, number>;
  task_id: string;
  since: number;
}

/** GET /v1/services/{role}/{env}/{name} (wire.rs ServiceView). */
export interface ServiceView {
  role: string;
  environment: string;
  name: string;
  job: string;
  primary_port: string;
  index: number;
  endpoints: ServiceEndpoint[];
}
