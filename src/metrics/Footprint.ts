import { readdirSync, readFileSync, statSync } from "node:fs"
import { join } from "node:path"

/**
 * What a process tree costs in memory, read from /proc: the proportional set size (PSS) of every
 * process below a root, and the memory of the files in /dev/shm that its processes made (named
 * `…-<pid>`, as the platform names its arenas and batch buffers).
 *
 * Shared memory is counted once, by file: a page of /dev/shm mapped by five processes is in each
 * one's PSS as a fifth, and a page no process maps is in none, so the processes' PSS is taken
 * without its shared memory (`Pss_Shmem`) and each file adds the blocks it holds (a sparse file
 * costs what was written into it, not its size).
 */
export interface Footprint {
  readonly processes: number
  /** The processes' PSS, their shared memory left out. */
  readonly processBytes: number
  /** Memory held by the tree's files in /dev/shm. */
  readonly sharedMemoryBytes: number
  readonly sharedMemoryFiles: number
  /** Processes whose memory this process may not read (another user's); counted in `processes` only. */
  readonly unreadable: number
}

export interface FootprintSources {
  readonly procDir?: string
  readonly shmDir?: string
}

export const footprintBytes = (footprint: Footprint): number => footprint.processBytes + footprint.sharedMemoryBytes

/** `root` and every live process below it (zombies hold no memory and are left out). */
export const processTree = (root: number, procDir = "/proc"): ReadonlyArray<number> => {
  const childrenOf = new Map<number, Array<number>>()
  let rootAlive = false
  for (const name of readdirSync(procDir)) {
    if (!/^\d+$/.test(name)) continue
    const stat = readStat(procDir, Number(name))
    if (stat === undefined || stat.state === "Z") continue
    if (stat.pid === root) rootAlive = true
    const siblings = childrenOf.get(stat.ppid) ?? []
    siblings.push(stat.pid)
    childrenOf.set(stat.ppid, siblings)
  }
  if (!rootAlive) return []
  const tree: Array<number> = []
  const pending = [root]
  while (pending.length > 0) {
    const pid = pending.pop()!
    tree.push(pid)
    pending.push(...(childrenOf.get(pid) ?? []))
  }
  return tree
}

/** The footprint of `root`'s process tree now. */
export const measureFootprint = (root: number = process.pid, sources: FootprintSources = {}): Footprint => {
  const procDir = sources.procDir ?? "/proc"
  const pids = processTree(root, procDir)
  let processBytes = 0
  let unreadable = 0
  let processes = 0
  for (const pid of pids) {
    const pss = processPss(pid, procDir)
    if (pss === "gone") continue
    processes++
    if (pss === "unreadable") unreadable++
    else processBytes += pss
  }
  const shm = sharedMemoryOf(new Set(pids), sources.shmDir ?? "/dev/shm")
  return { processes, processBytes, sharedMemoryBytes: shm.bytes, sharedMemoryFiles: shm.files, unreadable }
}

const mebibytes = (bytes: number) => `${Math.round(bytes / 2 ** 20)} MiB`

/** `14 processes, 612 MiB (PSS, 40 MiB of it in /dev/shm)`. */
export const formatFootprint = (footprint: Footprint): string => {
  const unreadable = footprint.unreadable > 0 ? `; ${footprint.unreadable} of the processes not readable` : ""
  return `${footprint.processes} processes, ${mebibytes(footprintBytes(footprint))} (PSS, ${mebibytes(footprint.sharedMemoryBytes)} of it in /dev/shm${unreadable})`
}

const readStat = (procDir: string, pid: number) => {
  let stat: string
  try {
    stat = readFileSync(join(procDir, String(pid), "stat"), "utf8")
  } catch {
    return undefined
  }
  // The command name in parentheses may hold spaces and parentheses: the fields start after the last ")".
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
  return { pid, state: fields[0] ?? "", ppid: Number(fields[1]) }
}

/** One process's PSS without its shared memory, as the footprint counts it. */
export const processPss = (pid: number, procDir = "/proc"): number | "unreadable" | "gone" => {
  let text: string
  try {
    text = readFileSync(join(procDir, String(pid), "smaps_rollup"), "utf8")
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code
    return code === "EACCES" || code === "EPERM" ? "unreadable" : "gone"
  }
  // A process that has exited but not been reaped reads as empty.
  if (text === "") return "gone"
  return kibField(text, "Pss") - kibField(text, "Pss_Shmem")
}

const kibField = (text: string, name: string): number => {
  const match = new RegExp(`^${name}:\\s+(\\d+) kB$`, "m").exec(text)
  return match === null ? 0 : Number(match[1]) * 1024
}

const sharedMemoryOf = (pids: ReadonlySet<number>, shmDir: string) => {
  let bytes = 0
  let files = 0
  let names: ReadonlyArray<string>
  try {
    names = readdirSync(shmDir)
  } catch {
    return { bytes, files }
  }
  for (const name of names) {
    const pid = /-(\d+)$/.exec(name)?.[1]
    if (pid === undefined || !pids.has(Number(pid))) continue
    try {
      bytes += statSync(join(shmDir, name)).blocks * 512
      files++
    } catch {
      // Removed since it was listed.
    }
  }
  return { bytes, files }
}
