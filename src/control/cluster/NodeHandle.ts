import * as Data from "effect/Data"
import type * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import type { Dtype } from "../../models/Dtype.js"
import type { Device } from "../../node/Devices.js"
import type { ExecutorPlacement } from "../../contracts/NodeRpcs.js"

/** An executor some node runs for the control plane. */
export interface RunningExecutor {
  /** Its address while it is up; undefined while it restarts or its node is lost. */
  url(): string | undefined
  /** Kills it so that its node's supervisor starts it again (its health check failed). */
  restart(reason: string): void
}

/**
 * A data-plane node did not do what it was asked (start an executor, make a model present): it
 * answered a failure, or nothing in time. Placement avoids such a node for a while and places the
 * task elsewhere.
 */
export class NodeCallError extends Data.TaggedError("NodeCallError")<{
  readonly node: string
  readonly message: string
}> {}

/**
 * What the control plane can ask of one node, wherever it runs: this process's own node agent,
 * or a data-plane node over NodeRpcs. Placement, task managers and redeployment see only this.
 */
export interface NodeHandle {
  readonly name: string
  readonly devices: ReadonlyArray<Device>
  /** Makes a model present on the node before its executors start with it, telling how it goes. */
  prepareModel(
    model: string,
    dtype: Dtype | undefined,
    onProgress: (message: string) => Effect.Effect<void>
  ): Effect.Effect<void, Error>
  /** Starts an executor, ready once this succeeds; closing the scope stops it. */
  startExecutor(placement: ExecutorPlacement): Effect.Effect<RunningExecutor, Error, Scope.Scope>
}
