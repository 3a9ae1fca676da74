/**
 * The processes of a platform a bench started, read from /proc: the tree below its serve process,
 * each one's role (serve, sidecar, an executor's router, engine or worker with its task and
 * devices, the app's sandboxed process), resident memory, and whether a process recorded earlier
 * still runs, and a process's peak resident memory. Shared by the soak, overload, models and VLM benches.
 */
import { readdirSync, readFileSync } from "node:fs"
import { basename } from "node:path"

/** The role of esbuild's helper process, which comes and goes with app registrations. */
export const ESBUILD_ROLE = "esbuild service"

/** The unit task that holds each device, from /tasks/list (empty if it cannot be read). */
export async function taskOnDevice(url: string): Promise<Map<string, string>> {
  const holders = new Map<string, string>()
  const response = await fetch(`${url}/tasks/list`).catch(() => undefined)
  if (!response?.ok) return holders
  const body = (await response.json()) as { tasks?: Array<{ name?: unknown; devices?: unknown }> }
  for (const task of body.tasks ?? []) {
    if (typeof task.name !== "string" || !Array.isArray(task.devices)) continue
    for (const device of task.devices) if (typeof device === "string") holders.set(device, task.name)
  }
  return holders
}

export interface ProcEntry {
  readonly pid: number
  readonly ppid: number
  /** Clock ticks after boot: with the pid, names one process even if the pid is reused later. */
  readonly startTime: string
  readonly state: string
}

/** Every process's parent, start time and state, from /proc/<pid>/stat. */
export function processTable(): Map<number, ProcEntry> {
  const table = new Map<number, ProcEntry>()
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue
    const entry = readStat(Number(name))
    if (entry !== undefined) table.set(entry.pid, entry)
  }
  return table
}

export function readStat(pid: number): ProcEntry | undefined {
  let stat: string
  try {
    stat = readFileSync(`/proc/${pid}/stat`, "utf8")
  } catch {
    return undefined
  }
  // The command name in parentheses may hold spaces and parentheses itself: fields start after the last ")".
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
  return { pid, ppid: Number(fields[1]), startTime: fields[19] ?? "", state: fields[0] ?? "" }
}

/** `root` and every process below it, each followed by its own descendants (depth first). */
export function processTree(root: number): Array<ProcEntry> {
  const table = processTable()
  const childrenOf = new Map<number, Array<ProcEntry>>()
  for (const entry of table.values()) {
    if (entry.state === "Z") continue
    const siblings = childrenOf.get(entry.ppid) ?? []
    siblings.push(entry)
    childrenOf.set(entry.ppid, siblings)
  }
  const tree: Array<ProcEntry> = []
  const visit = (entry: ProcEntry) => {
    tree.push(entry)
    for (const child of (childrenOf.get(entry.pid) ?? []).sort((a, b) => a.pid - b.pid)) visit(child)
  }
  const rootEntry = table.get(root)
  if (rootEntry !== undefined) visit(rootEntry)
  return tree
}

export function commandLine(pid: number): Array<string> {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, "utf8")
      .split("\0")
      .filter((arg) => arg !== "")
  } catch {
    return []
  }
}

/** `--name value` in `args`. */
const option = (args: ReadonlyArray<string>, name: string) => {
  const index = args.indexOf(name)
  return index < 0 ? undefined : args[index + 1]
}

/** An executor's process group, as its router's command line and /tasks/list name it. */
export interface ExecutorContext {
  readonly kind: string
  /** Its devices, and the unit task it serves where /tasks/list names one: `encoder-image-… on cpu:1`. */
  readonly where: string
}

/**
 * A process's role, from its command line: `cornserve serve`, `cornserve internal sidecar`,
 * `cornserve internal executor --kind K --devices D` (an executor's router, which runs its
 * engine), `internal executor-worker --rank R` (below their router, whose kind and devices they
 * take), the app's sandboxed process (run with Node's permission model; its command
 * line does not name the app: `app` is the one app the bench registers), or else the command's
 * short form. `taskOnDevice` gives the unit task that holds a device, from /tasks/list.
 */
export function roleOf(
  argv: ReadonlyArray<string>,
  parent: ExecutorContext | undefined,
  taskOnDevice: ReadonlyMap<string, string>,
  app: string
): { role: string; executor?: ExecutorContext } {
  const cli = argv.findIndex((arg) => basename(arg) === "cornserve")
  const args = cli < 0 ? [] : argv.slice(cli + 1)
  if (args[0] === "serve") return { role: "serve" }
  if (args[0] === "internal") {
    const [, command, ...rest] = args
    const executor = (role: string, context: ExecutorContext) => ({
      role: `executor ${context.kind} ${role} (${context.where})`,
      executor: context
    })
    const inherited = parent ?? { kind: "?", where: "?" }
    switch (command) {
      case "sidecar":
        return { role: "sidecar" }
      case "executor": {
        const devices = option(rest, "--devices") ?? "?"
        const task = taskOnDevice.get(devices.split(",")[0]!)
        const where = task === undefined ? devices : `${task} on ${devices}`
        return executor("router", { kind: option(rest, "--kind") ?? "?", where })
      }
      case "executor-worker":
        return executor(`worker ${option(rest, "--rank") ?? "?"}`, inherited)
      default:
        return { role: `internal ${command ?? "?"}` }
    }
  }
  if (argv.includes("--experimental-permission") || argv.includes("--permission")) return { role: `app ${app}` }
  if (argv[0] !== undefined && basename(argv[0]) === "esbuild") return { role: ESBUILD_ROLE }
  return { role: argv.length === 0 ? "?" : [basename(argv[0]!), ...argv.slice(1, 3)].join(" ") }
}

export interface ProcessSample {
  readonly pid: number
  readonly startTime: string
  readonly role: string
  readonly rssKiB: number
  readonly shmemKiB: number
}

/** `Name:   123 kB` in /proc/<pid>/status, in KiB. */
const statusKiB = (status: string, name: string) => {
  const match = new RegExp(`^${name}:\\s+(\\d+) kB`, "m").exec(status)
  return match === null ? 0 : Number(match[1])
}

export function sampleProcesses(
  root: number,
  taskOnDevice: ReadonlyMap<string, string>,
  app: string
): Array<ProcessSample> {
  const executors = new Map<number, ExecutorContext>()
  const samples: Array<ProcessSample> = []
  for (const entry of processTree(root)) {
    const argv = commandLine(entry.pid)
    let status: string
    try {
      status = readFileSync(`/proc/${entry.pid}/status`, "utf8")
    } catch {
      continue // gone since the walk
    }
    const { role, executor } = roleOf(argv, executors.get(entry.ppid), taskOnDevice, app)
    if (executor !== undefined) executors.set(entry.pid, executor)
    samples.push({
      pid: entry.pid,
      startTime: entry.startTime,
      role,
      rssKiB: statusKiB(status, "VmRSS"),
      shmemKiB: statusKiB(status, "RssShmem")
    })
  }
  return samples
}

/** Whether the process recorded as `pid` started at `startTime` still runs (a zombie does not). */
export function stillRunning(pid: number, startTime: string): boolean {
  const entry = readStat(pid)
  return entry !== undefined && entry.startTime === startTime && entry.state !== "Z"
}

/** CPU seconds a process has used (user + system), from /proc; undefined once it is gone. */
export const cpuSeconds = (pid: number): number | undefined => {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
    // utime and stime, fields 14 and 15 of stat(5), in clock ticks of 1/100 s.
    return (Number(fields[11]) + Number(fields[12])) / 100
  } catch {
    return undefined
  }
}

/** Peak resident memory (VmHWM) of process `pid`, in bytes; 0 once it is gone. */
export const peakRssOf = (pid: number): number => {
  try {
    return Number(/VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1] ?? 0) * 1024
  } catch {
    return 0
  }
}
