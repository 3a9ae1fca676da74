import { type ChildProcess, spawn } from "node:child_process"
import { fileURLToPath } from "node:url"
import { Effect } from "effect"
import { lifelineEnv } from "../../node/Lifeline.js"

export { exitWithParent } from "../../node/Lifeline.js"

const binPath = fileURLToPath(new URL("../../../bin/cornserve", import.meta.url))

export interface ChildOptions {
  /** `cornserve internal <command>` with these arguments. */
  readonly args: ReadonlyArray<string>
  readonly env?: Readonly<Record<string, string>>
  /** Called once if the child exits before its scope closes. */
  readonly onUnexpectedExit?: (code: number | null, signal: NodeJS.Signals | null) => void
  readonly stopGraceMs?: number
}

/**
 * Starts `cornserve internal ...` as a scoped child. Its stdin is a pipe from this process: when
 * this process dies for any reason the pipe closes and the child stops itself (see
 * `exitWithParent`), so no child outlives its parent. Closing the scope sends SIGTERM, then SIGKILL
 * after the grace period.
 */
export const startChild = (options: ChildOptions): Effect.Effect<ChildProcess, never, import("effect").Scope.Scope> =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const child = spawn(process.execPath, [binPath, "internal", ...options.args], {
        stdio: ["pipe", "inherit", "inherit"],
        env: lifelineEnv({ ...process.env, ...options.env })
      })
      let stopping = false
      child.once("exit", (code, signal) => {
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
