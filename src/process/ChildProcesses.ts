import { type ChildProcess, spawn } from "node:child_process"
import { rmSync } from "node:fs"
import { getPriority, setPriority } from "node:os"
import { fileURLToPath } from "node:url"
import { Effect } from "effect"
import { lifelineEnv } from "./Lifeline.js"

export { exitWithParent } from "./Lifeline.js"

const binPath = fileURLToPath(new URL("../../bin/cornserve", import.meta.url))

export interface ChildOptions {
  /** `cornserve internal <command>` with these arguments. */
  readonly args: ReadonlyArray<string>
  readonly env?: Readonly<Record<string, string>>
  /** Called once if the child exits before its scope closes. */
  readonly onUnexpectedExit?: (code: number | null, signal: NodeJS.Signals | null) => void
  readonly stopGraceMs?: number
  /** How much less CPU priority than this process the child gets (a nice increment). */
  readonly lowerPriority?: number
  /** Node and V8 flags for the child's runtime. */
  readonly nodeFlags?: ReadonlyArray<string>
  /**
   * The files a child with this pid makes and removes on its way out, which it cannot remove when
   * it is killed: removed once it has exited, however it exited.
   */
  readonly leaves?: (pid: number) => ReadonlyArray<string>
}

/**
 * Starts `cornserve internal ...` as a scoped child. Its stdin is a pipe from this process: when
 * this process dies for any reason the pipe closes and the child stops itself (see
 * `exitWithParent`), so no child outlives its parent. Closing the scope sends SIGTERM, then SIGKILL
 * after the grace period.
 */
const getPriorityOfSelf = (): number | undefined => {
  try {
    return getPriority()
  } catch {
    return undefined
  }
}

export const startChild = (options: ChildOptions): Effect.Effect<ChildProcess, never, import("effect").Scope.Scope> =>
  Effect.acquireRelease(
    Effect.sync(() => {
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
      let stopping = false
      child.once("exit", (code, signal) => {
        const left = child.pid === undefined ? [] : (options.leaves?.(child.pid) ?? [])
        for (const path of left) rmSync(path, { force: true })
        if (!stopping) options.onUnexpectedExit?.(code, signal)
      })
      return { child, stop: () => (stopping = true) }
    }),
    ({ child, stop }) =>
      Effect.async<void>((resume) => {
        stop()
        if (child.exitCode !== null || child.signalCode !== null) return resume(Effect.void)
        const timer = setTimeout(() => child.kill("SIGKILL"), options.stopGraceMs ?? 3_000)
        child.once("exit", () => {
          clearTimeout(timer)
          resume(Effect.void)
        })
        child.kill("SIGTERM")
      })
  ).pipe(Effect.map(({ child }) => child))
