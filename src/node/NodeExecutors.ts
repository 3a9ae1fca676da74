import * as Effect from "effect/Effect"
import * as ExecutionStrategy from "effect/ExecutionStrategy"
import * as Exit from "effect/Exit"
import * as Scope from "effect/Scope"
import type { ExecutorReport } from "../contracts/ClusterRpcs.js"
import { sameSettings } from "../contracts/ExecutorSettings.js"
import type { ExecutorPlacement } from "../contracts/NodeRpcs.js"
import type { NodeAgent } from "./NodeAgent.js"
import type { SupervisedProcess } from "../process/SupervisedProcess.js"

/**
 * The executors a data-plane node runs for the control plane, by the control plane's ids.
 *
 * An executor is held while the control plane says it holds it (its heartbeat answers list it).
 * One the control plane no longer holds (it restarted and did not place that task here again, or
 * it moved the task away while this node was out of reach) keeps running for the grace period,
 * so that a restarted control plane can take it back without a restart, and is stopped after it.
 * A control plane that cannot be reached holds nothing. Executors on the same devices run side by
 * side (the control plane shares a CPU device between tasks): a new one never stops another the
 * control plane still holds.
 */

interface Held {
  id: string
  readonly placement: ExecutorPlacement
  readonly scope: Scope.CloseableScope
  process: SupervisedProcess<string> | undefined
  /** Since when the control plane has not held it; undefined while it does. */
  unheldSince: number | undefined
}

/** The same work on the same devices: an executor a restarted control plane may keep. */
const samePlacement = (a: ExecutorPlacement, b: ExecutorPlacement) =>
  a.taskId === b.taskId &&
  a.program === b.program &&
  a.model === b.model &&
  a.dtype === b.dtype &&
  a.devices.join(",") === b.devices.join(",") &&
  sameSettings(a.settings, b.settings)

const overlaps = (executor: Held, placement: ExecutorPlacement) =>
  executor.placement.devices.some((id) => placement.devices.includes(id))

/** The executor's address as other machines reach it. */
const advertised = (url: string, host: string) => {
  const parsed = new URL(url)
  parsed.hostname = host.includes(":") ? `[${host}]` : host
  return parsed.origin
}

export const makeNodeExecutors = (
  agent: NodeAgent,
  options: { readonly advertiseHost: string; readonly graceMs: number; readonly parent: Scope.Scope }
) => {
  const held = new Map<string, Held>()

  const stop = (executor: Held, why: string): Effect.Effect<void> =>
    Effect.suspend(() => {
      if (held.get(executor.id) === executor) held.delete(executor.id)
      return Effect.zipRight(
        Effect.logInfo(`stopping executor ${executor.id} (task ${executor.placement.taskId}): ${why}`),
        Scope.close(executor.scope, Exit.void)
      )
    })

  const reportOf = (executor: Held): ExecutorReport => {
    const state = executor.process?.state
    const base = { id: executor.id, taskId: executor.placement.taskId, devices: executor.placement.devices }
    if (state === undefined || state._tag === "Starting") return { ...base, state: "starting" }
    if (state._tag === "Ready") return { ...base, state: "ready", url: advertised(state.ready, options.advertiseHost) }
    return { ...base, state: "restarting" }
  }

  /** Starts an executor, or keeps the one that already does the same work on the same devices. */
  const start = (placement: ExecutorPlacement) =>
    Effect.gen(function* () {
      const same = [...held.values()].find(
        (executor) => samePlacement(executor.placement, placement) && executor.process !== undefined
      )
      if (same !== undefined) {
        held.delete(same.id)
        same.id = placement.id
        same.unheldSince = undefined
        held.set(placement.id, same)
        yield* Effect.logInfo(`keeping executor ${placement.id} (task ${placement.taskId}): it already runs here`)
        const report = reportOf(same)
        if (report.url !== undefined) return { url: report.url, kept: true }
      }
      // On devices it shares with others, an executor starts beside them: the control plane shares
      // CPU devices between tasks. Only one the control plane has said it no longer holds gives way.
      for (const executor of [...held.values()]) {
        if (executor.id !== placement.id && executor.unheldSince !== undefined && overlaps(executor, placement))
          yield* stop(
            executor,
            `the control plane no longer holds it, and its devices now go to task ${placement.taskId}`
          )
      }
      const previous = held.get(placement.id)
      if (previous !== undefined) yield* stop(previous, "the control plane starts it again")
      const scope = yield* Scope.fork(options.parent, ExecutionStrategy.sequential)
      const executor: Held = { id: placement.id, placement, scope, process: undefined, unheldSince: undefined }
      held.set(placement.id, executor)
      const devices = agent.devices.filter((device) => placement.devices.includes(device.id))
      if (devices.length !== placement.devices.length) {
        yield* stop(executor, "it names devices this node does not have")
        return yield* Effect.fail(
          new Error(`this node has no device ${placement.devices.filter((id) => !devices.some((d) => d.id === id))}`)
        )
      }
      executor.process = yield* agent
        .startExecutor({
          kind: placement.program,
          model: placement.model,
          ...(placement.dtype === undefined ? {} : { dtype: placement.dtype }),
          devices,
          settings: placement.settings
        })
        .pipe(
          Scope.extend(scope),
          Effect.onError(() => stop(executor, "it failed to start"))
        )
      return { url: reportOf(executor).url!, kept: false }
    })

  return {
    start,
    stopById: (id: string) =>
      Effect.suspend(() => {
        const executor = held.get(id)
        return executor === undefined ? Effect.void : stop(executor, "the control plane stops it")
      }),
    restartById: (id: string, reason: string) =>
      Effect.sync(() => {
        held.get(id)?.process?.restart(reason)
      }),
    reports: (): ReadonlyArray<ExecutorReport> => [...held.values()].map(reportOf),
    /**
     * The control plane answered: it holds `owned` (those being started are held too). While it is
     * `settling` (just started, placing what it restored) none is counted as unheld yet.
     */
    heldBy: (owned: ReadonlyArray<string>, settling: boolean) =>
      Effect.sync(() => {
        const at = Date.now()
        for (const executor of held.values()) {
          if (settling || owned.includes(executor.id) || executor.process === undefined)
            executor.unheldSince = undefined
          else executor.unheldSince ??= at
        }
      }),
    /** The control plane is out of reach: it holds nothing. */
    unreachable: Effect.sync(() => {
      const at = Date.now()
      for (const executor of held.values()) executor.unheldSince ??= at
    }),
    /** Stops the executors nobody has held for the grace period. */
    sweep: Effect.suspend(() => {
      const at = Date.now()
      const expired = [...held.values()].filter(
        (executor) => executor.unheldSince !== undefined && at - executor.unheldSince > options.graceMs
      )
      return Effect.forEach(
        expired,
        (executor) =>
          stop(
            executor,
            `the control plane has not held it for ${Math.round(options.graceMs / 1000)} s (grace period)`
          ),
        { discard: true }
      )
    })
  }
}
