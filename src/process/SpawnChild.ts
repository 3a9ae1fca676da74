import { type ChildProcess, spawn } from "node:child_process"
import { getPriority, setPriority } from "node:os"
import { fileURLToPath } from "node:url"
import { lifelineEnv } from "./Lifeline.js"

/**
 * Starting a Cornserve child, with nothing but Node's own modules: an executor's engine starts its
 * workers with this before it has loaded anything else (see `bin/cornserve`).
 */

const binPath = fileURLToPath(new URL("../../bin/cornserve", import.meta.url))

export interface SpawnOptions {
  /** `cornserve internal <command>` with these arguments. */
  readonly args: ReadonlyArray<string>
  readonly env?: Readonly<Record<string, string>>
  /** How much less CPU priority than this process the child gets (a nice increment). */
  readonly lowerPriority?: number
  /** Node and V8 flags for the child's runtime. */
  readonly nodeFlags?: ReadonlyArray<string>
}

const getPriorityOfSelf = (): number | undefined => {
  try {
    return getPriority()
  } catch {
    return undefined
  }
}

/**
 * Spawns `cornserve internal ...` with its lifeline (and the priority asked for), outside any
 * scope: for a process that starts its children before it has loaded what supervises them, so
 * that they load side by side. `startChild({ started })` takes such a child into a scope.
 */
export const spawnChild = (options: SpawnOptions): ChildProcess => {
  const child = spawn(process.execPath, [...(options.nodeFlags ?? []), binPath, "internal", ...options.args], {
    stdio: ["pipe", "inherit", "inherit"],
    env: lifelineEnv({ ...process.env, ...options.env })
  })
  if (options.lowerPriority !== undefined && child.pid !== undefined) {
    try {
      setPriority(child.pid, Math.min(19, (getPriorityOfSelf() ?? 0) + options.lowerPriority))
    } catch {
      // A platform that does not let us lower it runs the child at our priority.
    }
  }
  return child
}
