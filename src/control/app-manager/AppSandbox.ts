import { spawnSync } from "node:child_process"
import { accessSync, constants as fsConstants, readdirSync, readFileSync, statSync } from "node:fs"
import { delimiter, join } from "node:path"
import { type AppRuntimeFiles, copiedRuntime, installedRuntime } from "./AppRuntimeFiles.js"

/** The user and group an app's process runs as. */
export interface AppUser {
  readonly uid: number
  readonly gid: number
}

/** How one app's process is started: `command ...args`, as `user` where the spawn itself sets it. */
export interface AppLaunch {
  readonly command: string
  readonly args: ReadonlyArray<string>
  readonly user: AppUser | undefined
  /** The user the app's code runs as, however it is set (undefined: the platform's own). */
  readonly runsAs: AppUser | undefined
}

/**
 * The operating system's boundary around an app's process, beside Node's permission model (which
 * its own documentation says holds nothing against malicious code, and which leaves the network
 * alone in Node 20):
 * - a network namespace of its own, which has only a loopback interface that is down: no address
 *   is reachable, the platform's ports on 127.0.0.1 included; its only channel is its pipe (fd 3);
 * - where the platform runs as root, a user of its own: a uid (and gid) drawn for each process from
 *   a range no other process uses, so it cannot change the priority of, signal or trace any other
 *   process, and reads only what every user may (not the platform's state directory, whose secrets
 *   are its owner's alone).
 * What cannot be had on this machine is said once, by `unprotected`.
 */
export interface AppSandbox {
  readonly runtime: AppRuntimeFiles
  /** How to start one app's process running node with `nodeArgs`. */
  launch(nodeArgs: ReadonlyArray<string>): AppLaunch
  /** What an app can still do here because part of the boundary is missing, one sentence each. */
  readonly unprotected: ReadonlyArray<string>
}

/**
 * Where apps' own users come from: a range no distribution or container manager hands out (above
 * systemd's container range, below 2^31 since some tools take ids as signed), large enough that
 * two apps' processes, of this platform or another on the machine, all but never share one.
 */
const appUidBase = 2_000_000_000
const appUidCount = 1 << 20
const nobody: AppUser = { uid: 65534, gid: 65534 }

const whatAnAppReachesWithoutNetns =
  "an app can reach the network, the platform's gateway (its admin routes included) and the ports of executors and sidecars"

let probed: AppSandbox | undefined

/** The sandbox this machine allows, found once by trying each part of it. */
export const appSandbox = (): AppSandbox => {
  probed ??= probe()
  return probed
}

const probe = (): AppSandbox => {
  const unprotected: Array<string> = []
  const root = process.getuid?.() === 0
  const network = networkNamespace(root)
  if (typeof network === "string") {
    unprotected.push(`apps run without a network namespace (${network}): ${whatAnAppReachesWithoutNetns}`)
  }
  const users = root ? appUsers(unprotected) : undefined
  if (!root) {
    unprotected.push(
      "apps run as the platform's own user, since it does not run as root: an app can change the priority of the platform's processes and signal them, and the OS lets it read what the platform's user may read and connect to the node's local sockets (the sidecar's, the executors')"
    )
  }
  const installed = installedRuntime()
  const runtime = users === undefined ? (installed ?? copiedRuntime()) : readableRuntime(installed, users, unprotected)
  const chosenUsers = runtime === undefined ? undefined : users
  return {
    runtime: runtime ?? installed ?? copiedRuntime(),
    unprotected,
    launch: (nodeArgs) => {
      const user = chosenUsers?.()
      if (typeof network === "string") return { command: process.execPath, args: nodeArgs, user, runsAs: user }
      // unshare sets the user itself, after it made the namespace, which takes root.
      const setUser = user === undefined ? [] : ["--setgid", String(user.gid), "--setuid", String(user.uid)]
      return {
        command: network.unshare,
        args: [...network.flags, ...setUser, "--", process.execPath, ...nodeArgs],
        user: undefined,
        runsAs: user
      }
    }
  }
}

/**
 * unshare(1) and the flags that give a process a network namespace of its own, or why there is
 * none. A user other than root needs a user namespace to make one, which the kernel may refuse.
 */
const networkNamespace = (
  root: boolean
): { readonly unshare: string; readonly flags: ReadonlyArray<string> } | string => {
  const unshare = executable("unshare")
  if (unshare === undefined) return "unshare(1) from util-linux is not installed"
  const flags = root ? ["--net"] : ["--user", "--net"]
  const tried = spawnSync(unshare, [...flags, "--", process.execPath, "--version"], {
    encoding: "utf8",
    timeout: 10_000
  })
  if (tried.status === 0) return { unshare, flags }
  const why = (tried.stderr ?? "").trim().split("\n")[0] || tried.error?.message || `exit code ${tried.status}`
  return `unshare ${flags.join(" ")} failed: ${why}`
}

/** A program found on the PATH. */
const executable = (name: string): string | undefined => {
  for (const dir of (process.env.PATH ?? "").split(delimiter)) {
    if (dir === "") continue
    const path = join(dir, name)
    try {
      accessSync(path, fsConstants.X_OK)
      if (statSync(path).isFile()) return path
    } catch {}
  }
  return undefined
}

/**
 * Where apps' users come from: a user per process out of the apps' range where this machine's
 * (or container's) user namespace maps it, else everyone's `nobody`.
 */
const appUsers = (unprotected: Array<string>): (() => AppUser) | undefined => {
  if (mapsIds("uid_map", appUidBase, appUidCount) && mapsIds("gid_map", appUidBase, appUidCount)) {
    return () => {
      const id = appUidBase + Math.floor(Math.random() * appUidCount)
      return { uid: id, gid: id }
    }
  }
  if (mapsIds("uid_map", nobody.uid, 1) && mapsIds("gid_map", nobody.gid, 1)) {
    unprotected.push(
      `apps all run as nobody (ids ${appUidBase} to ${appUidBase + appUidCount - 1} are not mapped in this user namespace): an app can change the priority of another app's process and signal it`
    )
    return () => nobody
  }
  unprotected.push(
    "apps run as root, since this user namespace maps neither the apps' ids nor nobody: an app can change the priority of any process and the OS lets it read the platform's state directory"
  )
  return undefined
}

/** Whether this process's user namespace maps ids `first` to `first + count - 1` (its `/proc/self/*_map`). */
const mapsIds = (file: "uid_map" | "gid_map", first: number, count: number): boolean => {
  try {
    return readFileSync(`/proc/self/${file}`, "utf8")
      .split("\n")
      .map((line) => line.trim().split(/\s+/).map(Number))
      .some(
        ([inside, , length]) =>
          inside !== undefined && length !== undefined && inside <= first && first + count <= inside + length
      )
  } catch {
    return false
  }
}

/**
 * Runtime files the apps' users can load: the installed ones where they can, else a copy that all
 * may read; undefined (apps run as root) where not even the copy loads, such as a node binary that
 * only root may run.
 */
const readableRuntime = (
  installed: AppRuntimeFiles | undefined,
  users: () => AppUser,
  unprotected: Array<string>
): AppRuntimeFiles | undefined => {
  const user = users()
  if (installed !== undefined && loads(installed, user) === undefined) return installed
  const copy = copiedRuntime()
  const failure = loads(copy, user)
  if (failure === undefined) return copy
  unprotected.push(
    `apps run as root, since their user (uid ${user.uid}) cannot run node or load the app runtime (${failure}): an app can change the priority of any process and the OS lets it read the platform's state directory`
  )
  return undefined
}

/**
 * Why `user` cannot load the runtime, or undefined when it can: node, run as the user, opens every
 * module and manifest of the runtime's directories for reading, as the kernel (its permission bits,
 * its ACLs, every directory above) answers that user. Cheaper than importing them, which the
 * platform's start would wait for.
 */
const loads = (runtime: AppRuntimeFiles, user: AppUser): string | undefined => {
  // A link's name is checked too: the user must be able to reach it (every directory above it).
  const files = [...runtime.readableDirs.flatMap(loadableFiles), ...runtime.readableLinks]
  const tried = spawnSync(process.execPath, ["--input-type=module", "-e", accessScript], {
    uid: user.uid,
    gid: user.gid,
    env: {},
    cwd: "/",
    input: JSON.stringify(files),
    encoding: "utf8",
    timeout: 60_000
  })
  if (tried.status === 0) return undefined
  return (
    tried.stdout.trim() || tried.error?.message || tried.stderr.trim().split("\n")[0] || `exit code ${tried.status}`
  )
}

/** Reads a JSON list of paths on stdin; prints the first that cannot be read, and why, and fails. */
const accessScript = `
import { accessSync, constants, readFileSync } from "node:fs"
for (const file of JSON.parse(readFileSync(0, "utf8"))) {
  try {
    accessSync(file, constants.R_OK)
  } catch (error) {
    console.log(file + ": " + error.code)
    process.exit(1)
  }
}`

/** The files node loads from a runtime directory: its modules and package manifests, at every depth. */
const loadableFiles = (dir: string): ReadonlyArray<string> =>
  readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name)
    if (entry.isDirectory()) return loadableFiles(path)
    return entry.isFile() && /\.(m|c)?js$|^package\.json$/.test(entry.name) ? [path] : []
  })
