/**
 * The test run's reaper: a detached process that the vitest main process starts in its global
 * setup (globalSetup.ts), with a pipe from that process as its stdin. It outlives whatever killed
 * the run and ends what the run started:
 *
 * - When a test worker (a fork) is gone, by a normal end, a crash or a kill, it ends every process
 *   that worker started (their environment names the worker: CORNSERVE_TEST_OWNER) with their
 *   descendants and registered process groups, and removes that worker's registered network
 *   namespaces, links, paths and shared-memory files.
 * - When the run is over (its stdin ends: the main process closed it, or exited, SIGKILL included)
 *   or the runner that started vitest died (npm, npx: see `ancestors`), it does the same for the
 *   whole run (every process whose environment names the run: CORNSERVE_TEST_RUN), then exits.
 *
 * Workers register what they make by appending JSON lines to the registry file (registry.ts):
 *   {"owner": "<pid>-<start>", "op": "add" | "del", "kind": "owner" | "group" | "netns" | "link"
 *    | "shm" | "path", "value": ..., "start"?: <a group leader's start time>}
 *
 * Plain JavaScript run by node: nothing to build, nothing of the project imported. Usage:
 *   node watchdog.mjs '<JSON config>'    (see globalSetup.ts for its fields)
 */
import { execFileSync } from "node:child_process"
import { closeSync, openSync, readdirSync, readFileSync, readSync, rmSync, statSync } from "node:fs"
import { join } from "node:path"

const config = JSON.parse(process.argv[2] ?? "{}")
const tickMs = 200
/** How long killed processes get to disappear from /proc before cleanup goes on regardless. */
const killWaitMs = 2_000
/** Shared-memory files of Cornserve processes end with their owner's pid (src/node/AbandonedFiles.ts). */
const pidFilePrefixes = ["cornserve-arena-", "cornserve-batches-"]

const log = (message) => process.stderr.write(`reaper ${new Date().toISOString()} ${message}\n`)

// --- /proc -----------------------------------------------------------------------------------

/** Fields of /proc/PID/stat after the command name: [0] state, [1] ppid, [2] pgrp, [19] start time. */
const statOf = (pid) => {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, "utf8")
    return text.slice(text.lastIndexOf(") ") + 2).split(" ")
  } catch {
    return undefined
  }
}

/** Running (not gone, not a zombie), and the same process as when `start` was read, if given. */
const isAlive = (pid, start) => {
  const stat = statOf(pid)
  if (stat === undefined || stat[0] === "Z" || stat[0] === "X") return false
  // An unknown start time (0, null) checks the pid alone.
  return !start || Number(stat[19]) === start
}

const processTable = () => {
  const table = []
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue
    const stat = statOf(entry)
    if (stat === undefined || stat[0] === "Z") continue
    let environ = ""
    try {
      environ = `\0${readFileSync(`/proc/${entry}/environ`, "latin1")}`
    } catch {}
    table.push({ pid: Number(entry), ppid: Number(stat[1]), pgrp: Number(stat[2]), environ })
  }
  return table
}

const signal = (pid, name) => {
  try {
    process.kill(pid, name)
    return true
  } catch {
    return false
  }
}

// --- the registry ----------------------------------------------------------------------------

/** owner key ("<pid>-<start>") → what that worker registered. */
const owners = new Map()

const ownerEntry = (key) => {
  let entry = owners.get(key)
  if (entry === undefined) {
    entry = { groups: new Map(), netns: new Set(), link: new Set(), shm: new Set(), path: new Set() }
    owners.set(key, entry)
  }
  return entry
}

let offset = 0
let pending = ""

const readRegistry = () => {
  let fd
  try {
    fd = openSync(config.registry, "r")
  } catch {
    return
  }
  try {
    const size = statSync(config.registry).size
    if (size <= offset) return
    const buffer = Buffer.alloc(size - offset)
    const read = readSync(fd, buffer, 0, buffer.length, offset)
    offset += read
    pending += buffer.subarray(0, read).toString("utf8")
  } finally {
    closeSync(fd)
  }
  const lines = pending.split("\n")
  pending = lines.pop() ?? ""
  for (const line of lines) {
    if (line.trim() === "") continue
    let record
    try {
      record = JSON.parse(line)
    } catch {
      log(`unreadable registry line: ${line}`)
      continue
    }
    const entry = ownerEntry(record.owner)
    if (record.kind === "owner") continue
    if (record.kind === "group") {
      if (record.op === "add") entry.groups.set(record.value, record.start)
      else entry.groups.delete(record.value)
      continue
    }
    const set = entry[record.kind]
    if (set === undefined) continue
    if (record.op === "add") set.add(record.value)
    else set.delete(record.value)
  }
}

const ownerAlive = (key) => {
  const [pid, start] = key.split("-").map(Number)
  return isAlive(pid, start)
}

// --- reaping ---------------------------------------------------------------------------------

/**
 * SIGKILLs every process `selects` picks (by its environment), those of `groups` (pgid → the
 * leader's start time), and all their descendants, but none that `spares` keeps. Each is stopped
 * (SIGSTOP) first, then the table is read again, so that a child forked meanwhile is found too;
 * returns the pids killed.
 */
const killAll = async (selects, groups, spares) => {
  const victims = new Set()
  // A group whose leader is another process than the one registered (its pid reused) is not ours;
  // one whose leader is gone but whose members live on still is (a pgid is not reused meanwhile).
  const liveGroups = [...groups].filter(([pgid, start]) => {
    const stat = statOf(pgid)
    return stat === undefined || stat[0] === "Z" || Number(stat[19]) === start
  })
  const groupIds = new Set(liveGroups.map(([pgid]) => pgid))
  for (let round = 0; round < 10; round++) {
    const table = processTable()
    const before = victims.size
    const add = (row) => {
      if (row.pid === process.pid || row.pid <= 1 || victims.has(row.pid) || spares(row)) return
      victims.add(row.pid)
      signal(row.pid, "SIGSTOP")
    }
    for (const row of table) if (groupIds.has(row.pgrp) || selects(row.environ)) add(row)
    for (let size = -1; size !== victims.size; ) {
      size = victims.size
      for (const row of table) if (victims.has(row.ppid)) add(row)
    }
    for (const pgid of groupIds) signal(-pgid, "SIGSTOP")
    if (victims.size === before) break
  }
  for (const pgid of groupIds) signal(-pgid, "SIGKILL")
  for (const pid of victims) signal(pid, "SIGKILL")
  const deadline = Date.now() + killWaitMs
  while ([...victims].some((pid) => isAlive(pid)) && Date.now() < deadline)
    await new Promise((resolve) => setTimeout(resolve, 20))
  return victims
}

const quietly = (command, args) => {
  try {
    execFileSync(command, args, { stdio: "ignore", timeout: 5_000 })
  } catch {}
}

const removeSharedMemory = (prefixes, pids) => {
  let names = []
  try {
    names = readdirSync(config.shmDir)
  } catch {
    return
  }
  for (const name of names) {
    const pidMatch = /-(\d+)$/.exec(name)
    const pid = pidMatch === null ? undefined : Number(pidMatch[1])
    const ours =
      [...prefixes].some((prefix) => name.startsWith(prefix)) ||
      (pid !== undefined &&
        pidFilePrefixes.some((prefix) => name.startsWith(prefix)) &&
        // Of a process killed here, or abandoned: its owner is gone (the platform's own rule).
        (pids.has(pid) || !isAliveAtAll(pid)))
    if (ours) rmSync(join(config.shmDir, name), { force: true })
  }
}

/**
 * The run directories in the temporary directory of node agents killed here (`cornserve-node-<pid>-...`)
 * and of executors started by hand (`cornserve-executor-<pid>`) once their owner is gone
 * (src/node/AbandonedFiles.ts).
 */
const removeRunDirectories = (pids) => {
  let names = []
  try {
    names = readdirSync(config.tmpDir)
  } catch {
    return
  }
  for (const name of names) {
    const node = /^cornserve-node-(\d+)-/.exec(name)
    const executor = /^cornserve-executor-(\d+)$/.exec(name)
    if (
      (node !== null && pids.has(Number(node[1]))) ||
      (executor !== null && (pids.has(Number(executor[1])) || !isAliveAtAll(Number(executor[1]))))
    )
      rmSync(join(config.tmpDir, name), { recursive: true, force: true })
  }
}

/** Whether any process has this pid (another user's included). */
const isAliveAtAll = (pid) => {
  try {
    process.kill(pid, 0)
    return true
  } catch (error) {
    return error.code === "EPERM"
  }
}

/** Ends what the owners `keys` made, and processes `selects` picks; then forgets those owners. */
const reap = async (keys, selects, spares = (row) => row.pid === config.runner.pid) => {
  const groups = new Map()
  const prefixes = new Set()
  const netns = new Set()
  const links = new Set()
  const paths = new Set()
  for (const key of keys) {
    const entry = owners.get(key)
    if (entry === undefined) continue
    for (const [pgid, start] of entry.groups) groups.set(pgid, start)
    for (const value of entry.shm) prefixes.add(value)
    for (const value of entry.netns) netns.add(value)
    for (const value of entry.link) links.add(value)
    for (const value of entry.path) paths.add(value)
  }
  const killed = await killAll(selects, groups, spares)
  removeSharedMemory(prefixes, killed)
  removeRunDirectories(killed)
  for (const name of [...netns].reverse()) quietly("ip", ["netns", "del", name])
  for (const name of links) quietly("ip", ["link", "del", name])
  for (const path of paths) rmSync(path, { recursive: true, force: true })
  for (const key of keys) owners.delete(key)
  if (killed.size > 0 || netns.size > 0)
    log(`reaped ${keys.join(", ") || "the run"}: ${killed.size} processes, ${netns.size} namespaces`)
}

const ownerMarker = (key) => `\0${config.envNames.owner}=${key}\0`
const runMarker = `\0${config.envNames.run}=${config.runId}\0`

let finishing = false

/** The run is over: end everything of it, remove the registry, exit. */
const finish = async (why, killRunner) => {
  if (finishing) return
  finishing = true
  clearInterval(timer)
  log(`the run is over (${why})`)
  try {
    if (killRunner && isAlive(config.runner.pid, config.runner.start)) signal(config.runner.pid, "SIGKILL")
    readRegistry()
    const keys = [...owners.keys()]
    const markers = keys.map(ownerMarker)
    await reap(
      keys,
      (environ) => environ.includes(runMarker) || markers.some((marker) => environ.includes(marker)),
      // Once the runner is killed, whatever it left is fair game. Until then it waits for this
      // process to exit, and its own children (workers, vite's esbuild) are its to close: only
      // those a worker started are not spared.
      killRunner
        ? () => false
        : (row) =>
            row.pid === config.runner.pid ||
            (row.ppid === config.runner.pid && !markers.some((marker) => row.environ.includes(marker)))
    )
  } catch (error) {
    log(`the last sweep failed: ${error?.stack ?? error}`)
  } finally {
    rmSync(config.dir, { recursive: true, force: true })
    process.exit(0)
  }
}

let busy = false

const tick = async () => {
  if (busy || finishing) return
  busy = true
  try {
    const deadAncestor = config.ancestors.find(({ pid, start }) => !isAlive(pid, start))
    if (deadAncestor !== undefined) return void (await finish(`the runner ${deadAncestor.pid} is gone`, true))
    if (!isAlive(config.runner.pid, config.runner.start)) return void (await finish("vitest is gone", false))
    readRegistry()
    for (const key of [...owners.keys()]) {
      if (ownerAlive(key)) continue
      const marker = ownerMarker(key)
      await reap([key], (environ) => environ.includes(marker))
    }
  } catch (error) {
    log(`tick failed: ${error?.stack ?? error}`)
  } finally {
    busy = false
  }
}

const timer = setInterval(() => void tick(), tickMs)
// Signals that would end this process early are for the run, not for it (it is in a session of
// its own, but a `kill` by pid may still reach it): it finishes its work instead.
for (const name of ["SIGINT", "SIGTERM", "SIGHUP"]) process.on(name, () => void finish(name, false))

process.stdin.on("data", () => undefined)
process.stdin.once("end", () => void finish("its stdin ended", false))
process.stdin.once("close", () => void finish("its stdin closed", false))
process.stdin.once("error", () => void finish("its stdin failed", false))
log(`watching run ${config.runId} (vitest ${config.runner.pid})`)
