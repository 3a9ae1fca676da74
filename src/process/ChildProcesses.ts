import type { ChildProcess } from "node:child_process"
import { rmSync } from "node:fs"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import { type SpawnOptions, spawnChild } from "./SpawnChild.js"

export { exitWithParent } from "./Lifeline.js"
export { spawnChild } from "./SpawnChild.js"

export interface ChildOptions extends SpawnOptions {
  /** Called once if the child exits before its scope closes. */
  readonly onUnexpectedExit?: (code: number | null, signal: NodeJS.Signals | null) => void
  readonly stopGraceMs?: number
  /**
   * The files a child with this pid makes and removes on its way out, which it cannot remove when
   * it is killed: removed once it has exited, however it exited.
   */
  readonly leaves?: (pid: number) => ReadonlyArray<string>
}

const hasExited = (child: ChildProcess) => child.exitCode !== null || child.signalCode !== null

/**
 * Starts `cornserve internal ...` as a scoped child. Its stdin is a pipe from this process: when
 * this process dies for any reason the pipe closes and the child stops itself (see
 * `exitWithParent`), so no child outlives its parent. Closing the scope sends SIGTERM, then SIGKILL
 * after the grace period.
 */
export const startChild = (
  options: ChildOptions & {
    /** A child `spawnChild` started with these options, taken as it is (even if it has exited since). */
    readonly started?: ChildProcess
  }
): Effect.Effect<ChildProcess, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const child = options.started ?? spawnChild(options)
      let stopping = false
      const onExit = (code: number | null, signal: NodeJS.Signals | null) => {
        const left = child.pid === undefined ? [] : (options.leaves?.(child.pid) ?? [])
        for (const path of left) rmSync(path, { force: true })
        if (!stopping) options.onUnexpectedExit?.(code, signal)
      }
      // A child started early may be gone already: its exit is heard now, as it would have been.
      if (hasExited(child)) queueMicrotask(() => onExit(child.exitCode, child.signalCode))
      else child.once("exit", onExit)
      return { child, stop: () => (stopping = true) }
    }),
    ({ child, stop }) =>
      Effect.async<void>((resume) => {
        stop()
        if (hasExited(child)) return resume(Effect.void)
        const timer = setTimeout(() => child.kill("SIGKILL"), options.stopGraceMs ?? 3_000)
        child.once("exit", () => {
          clearTimeout(timer)
          resume(Effect.void)
        })
        child.kill("SIGTERM")
      })
  ).pipe(Effect.map(({ child }) => child))
