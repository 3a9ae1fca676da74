import { Effect, type Scope } from "effect"
import type { UnitTaskSpec } from "../app-runtime/driver/protocol.js"
import type { Device } from "../node/Devices.js"

/** A running executor (a process group) that serves one unit task on its devices. */
export interface Executor {
  readonly id: string
  readonly devices: ReadonlyArray<Device>
  readonly url: string
}

/**
 * How to run one kind of unit task: how many devices an executor takes, and how to start one as a
 * scoped resource (closing the scope stops its processes).
 */
export interface ExecutorKind {
  readonly kind: string
  devicesPerExecutor(task: UnitTaskSpec): number
  start(task: UnitTaskSpec, devices: ReadonlyArray<Device>): Effect.Effect<Executor, Error, Scope.Scope>
}

/**
 * The executor kinds this platform can run, by task kind. The encoder, LLM and generator
 * executors join this list as they are built; a task of a kind that is not here cannot deploy.
 */
export class ExecutorKinds extends Effect.Service<ExecutorKinds>()("cornserve/ExecutorKinds", {
  succeed: {
    kinds: new Map<string, ExecutorKind>()
  }
}) {}
