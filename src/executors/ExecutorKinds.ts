import type { Dtype } from "../models/Dtype.js"
import { Effect, type Scope } from "effect"
import type { UnitTaskSpec } from "../app-runtime/driver/protocol.js"
import type { Device } from "../node/Devices.js"
import { NodeAgent } from "../node/NodeAgent.js"

/** A running executor (a process group) that serves one unit task on its devices. */
export interface Executor {
  readonly devices: ReadonlyArray<Device>
  /** Its address while it is up; undefined while it restarts. */
  url(): string | undefined
  /** Kills it so that its supervisor starts it again (its health check failed). */
  restart(reason: string): void
}

/**
 * How to run one kind of unit task: how many devices an executor takes, and how to start one as a
 * scoped resource (closing the scope stops its processes).
 */
export interface ExecutorKind {
  readonly kind: string
  devicesPerExecutor(task: UnitTaskSpec): number
  /** Makes what the task needs present on the node before its executors start (its model), telling how it goes. */
  prepare?(task: UnitTaskSpec, onProgress: (message: string) => Effect.Effect<void>): Effect.Effect<void, Error>
  start(task: UnitTaskSpec, devices: ReadonlyArray<Device>): Effect.Effect<Executor, Error, Scope.Scope>
}

const modelOf = (task: UnitTaskSpec) => (task.config as { readonly model: string }).model
const batchArgs = (task: UnitTaskSpec) => {
  const size = (task.config as { readonly maxBatchSize?: number }).maxBatchSize
  return size === undefined ? [] : ["--max-batch-size", String(size)]
}

const dtypeArgs = (task: UnitTaskSpec) => {
  const dtype = (task.config as { readonly dtype?: string }).dtype
  return dtype === undefined ? [] : ["--dtype", dtype]
}

/**
 * The executor kinds this platform runs, by unit-task kind: the encoder on Eric, the LLM on the
 * LLM executor, image and audio generators on Geri. Each executor is a supervised process group
 * started by the node agent.
 */
export class ExecutorKinds extends Effect.Service<ExecutorKinds>()("cornserve/ExecutorKinds", {
  effect: Effect.gen(function* () {
    const agent = yield* NodeAgent
    const onAgent =
      (executor: "eric" | "geri" | "llm", extraArgs: (task: UnitTaskSpec) => ReadonlyArray<string>) =>
      (kind: string): ExecutorKind => ({
        kind,
        devicesPerExecutor: () => 1,
        prepare: (task, onProgress) =>
          agent.prepareModel(modelOf(task), (task.config as { readonly dtype?: Dtype }).dtype, onProgress),
        start: (task, devices) =>
          Effect.map(
            agent.startExecutor({ kind: executor, model: modelOf(task), devices, args: extraArgs(task) }),
            (process): Executor => ({
              devices,
              url: () => (process.state._tag === "Ready" ? process.state.ready : undefined),
              restart: (reason) => process.restart(reason)
            })
          )
      })
    const kinds = new Map<string, ExecutorKind>(
      [
        onAgent("eric", batchArgs)("encoder"),
        onAgent("llm", dtypeArgs)("llm"),
        onAgent("geri", batchArgs)("image-generator"),
        onAgent("geri", batchArgs)("audio-generator")
      ].map((kind) => [kind.kind, kind])
    )
    return { kinds }
  }),
  dependencies: [NodeAgent.Default]
}) {}
