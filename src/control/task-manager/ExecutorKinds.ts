import type { Dtype } from "../../models/Dtype.js"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import type { UnitTaskSpec } from "../../app-runtime/driver/protocol.js"
import { ServeConfig } from "../../config/ServeConfig.js"
import type { Device } from "../../node/Devices.js"
import type { NodeHandle } from "../cluster/NodeHandle.js"
import { taskSettings } from "./TaskSettings.js"

/** A running executor (a process group) that serves one unit task on its devices. */
export interface Executor {
  readonly devices: ReadonlyArray<Device>
  /** Its address while it is up; undefined while it restarts. */
  url(): string | undefined
  /** Kills it so that its supervisor starts it again (its health check failed). */
  restart(reason: string): void
}

/** Where one executor runs: a node, its devices there, and the control plane's name for it. */
export interface ExecutorSlot {
  readonly node: NodeHandle
  readonly devices: ReadonlyArray<Device>
  /** ONNX Runtime threads per device: its share of a shared CPU device's budget. */
  readonly threads: number
  readonly id: string
}

/**
 * How to run one kind of unit task: how many devices an executor takes, and how to start one on
 * a node as a scoped resource (closing the scope stops its processes).
 */
export interface ExecutorKind {
  readonly kind: string
  devicesPerExecutor(task: UnitTaskSpec): number
  /** Makes what the task needs present on a node before its executors start there (its model), telling how it goes. */
  prepare?(
    task: UnitTaskSpec,
    node: NodeHandle,
    onProgress: (message: string) => Effect.Effect<void>
  ): Effect.Effect<void, Error>
  start(task: UnitTaskSpec, slot: ExecutorSlot): Effect.Effect<Executor, Error, Scope.Scope>
}

const modelOf = (task: UnitTaskSpec) => (task.config as { readonly model: string }).model
const dtypeOf = (task: UnitTaskSpec) => (task.config as { readonly dtype?: Dtype }).dtype
/** An encoder's adapters: models whose projectors it runs over its tower, each prepared on its node too. */
const adaptersOf = (task: UnitTaskSpec): ReadonlyArray<string> =>
  (task.config as { readonly adapters?: ReadonlyArray<string> }).adapters ?? []

/**
 * The executor kinds this platform runs, by unit-task kind: the encoder and the text embedder on
 * Eric, the speech recognizer on Eric too, the LLM on the LLM executor, image and audio generators and the speech synthesizer on Geri. Each executor is a
 * supervised process group that the node of its devices starts.
 */
export class ExecutorKinds extends Effect.Service<ExecutorKinds>()("cornserve/ExecutorKinds", {
  effect: Effect.gen(function* () {
    const { engineDefaults } = yield* ServeConfig
    const onNode =
      (program: "eric" | "geri" | "llm") =>
      (kind: string): ExecutorKind => ({
        kind,
        devicesPerExecutor: () => 1,
        prepare: (task, node, onProgress) =>
          Effect.forEach([modelOf(task), ...adaptersOf(task)], (model) =>
            node.prepareModel(model, dtypeOf(task), onProgress)
          ).pipe(Effect.asVoid),
        start: (task, slot) =>
          Effect.map(
            slot.node.startExecutor({
              id: slot.id,
              taskId: task.id,
              program,
              model: modelOf(task),
              ...(dtypeOf(task) === undefined ? {} : { dtype: dtypeOf(task) }),
              devices: slot.devices.map((device) => device.id),
              settings: { ...taskSettings(task, engineDefaults), threadsPerDevice: slot.threads }
            }),
            (running): Executor => ({ devices: slot.devices, url: running.url, restart: running.restart })
          )
      })
    const kinds = new Map<string, ExecutorKind>(
      [
        onNode("eric")("encoder"),
        onNode("eric")("text-embedder"),
        onNode("eric")("speech-recognizer"),
        onNode("llm")("llm"),
        onNode("geri")("image-generator"),
        onNode("geri")("audio-generator"),
        onNode("geri")("speech-synthesizer"),
        onNode("geri")("codec-decoder")
      ].map((kind) => [kind.kind, kind])
    )
    return { kinds }
  })
}) {}
