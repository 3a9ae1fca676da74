import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import type { UnitTaskSpec } from "../../app-runtime/driver/protocol.js"
import type { ServeOptions } from "../../config/ServeConfig.js"
import { NodeCallError } from "../cluster/NodeHandle.js"
import type { NodeRegistry } from "../cluster/NodeRegistry.js"
import { DeploymentFailed, DevicesExhausted } from "../errors.js"
import type { ExecutorKind } from "../task-manager/ExecutorKinds.js"
import type { DeviceHoldings } from "./DeviceHoldings.js"
import { type PlacedExecutor, type PlacementNode, type PlacementRequest, place } from "./Placement.js"

/** How long a node that failed a start is avoided by placement (while other nodes have room). */
const troubledForMs = 5 * 60_000

/**
 * The placement policy (Placement.ts) applied to the cluster as it stands: the ready nodes and the
 * devices already held, nodes that failed a start lately avoided while others have room, the
 * devices of what it places taken at once; and the way to the placed executors' nodes: their
 * handles, and the task's model made present there. The resource manager calls it under its lock.
 */
export const makeLivePlacement = (options: {
  readonly role: ServeOptions["role"]
  readonly registry: NodeRegistry
  readonly kinds: ReadonlyMap<string, ExecutorKind>
  readonly holdings: DeviceHoldings
}) => {
  const { role, registry, kinds, holdings } = options
  /**
   * Nodes that failed to start an executor or make a model present, until when: placement goes
   * elsewhere while another node has room (a node that lies about its devices takes nothing).
   */
  const troubled = new Map<string, number>()

  const placementNodes = (): ReadonlyArray<PlacementNode> =>
    registry.nodes().map((node) => ({ name: node.name, state: node.state, devices: node.devices }))

  /** Device groups of ready nodes that already run an executor of this task (kept across a restart). */
  const preferredFor = (taskId: string) =>
    registry
      .nodes()
      .filter((node) => node.state === "ready")
      .flatMap((node) =>
        [...node.executors.values()]
          .filter((executor) => executor.taskId === taskId)
          .map((executor) => ({ node: node.name, devices: executor.devices }))
      )

  /** Nodes placement avoids now: those that failed a start lately. */
  const troubledNodes = () => {
    const at = Date.now()
    for (const [node, until] of troubled) if (until <= at) troubled.delete(node)
    return [...troubled.keys()]
  }

  /** The node an executor or model failed on: avoided for a while. */
  const noteFailure = (error: unknown, failedOn?: Set<string>) =>
    Effect.suspend(() => {
      if (!(error instanceof NodeCallError)) return Effect.void
      troubled.set(error.node, Date.now() + troubledForMs)
      failedOn?.add(error.node)
      return Effect.logWarning(`node ${error.node} failed a start; placement avoids it for a while: ${error.message}`)
    })

  /** The nodes these executors started on are trusted again. */
  const startedOn = (placed: ReadonlyArray<PlacedExecutor>) => {
    for (const executor of placed) troubled.delete(executor.node)
  }

  /** Placement as the policy answers it, avoiding troubled nodes while the others have room. */
  const placeExecutors = (
    requests: ReadonlyArray<PlacementRequest>
  ): Effect.Effect<ReadonlyArray<PlacedExecutor>, DevicesExhausted> =>
    Effect.suspend(() => {
      const nodes = placementNodes()
      const held = holdings.all()
      const avoiding = troubledNodes()
      const elsewhere =
        avoiding.length === 0
          ? undefined
          : place(
              nodes,
              held,
              requests.map((request) => ({ ...request, avoidNodes: [...(request.avoidNodes ?? []), ...avoiding] }))
            )
      const answer = elsewhere === undefined || Either.isLeft(elsewhere) ? place(nodes, held, requests) : elsewhere
      return Either.match(answer, {
        onLeft: (shortfall) => Effect.fail(new DevicesExhausted({ message: shortfall.message })),
        onRight: (placed) => {
          holdings.take(placed)
          return Effect.succeed(placed)
        }
      })
    })

  /** The placed executors as the task manager starts them: each with its node's handle. */
  const groupsOf = (placed: ReadonlyArray<PlacedExecutor>) =>
    Effect.forEach(placed, (executor) => {
      const node = registry.handle(executor.node)
      return node === undefined
        ? Effect.fail(new DeploymentFailed({ message: `node ${executor.node} is gone` }))
        : Effect.succeed({ node, devices: executor.devices, threads: executor.threads })
    })

  /** Where executors went: on a cluster, each; on one node, those that share a device. */
  const logPlacement = (placed: ReadonlyArray<PlacedExecutor>) =>
    Effect.forEach(
      placed.filter((executor) => role !== "all" || executor.reason.startsWith("shares")),
      (executor) =>
        Effect.logInfo(
          `placing an executor of task ${executor.task} on node ${executor.node} (${executor.devices.map((device) => device.id).join(", ")}, ${executor.threads} thread(s) each): ${executor.reason}`
        ),
      { discard: true }
    )

  /** Makes the task's model present on every node it is placed on. */
  const prepareOn = (
    spec: UnitTaskSpec,
    placed: ReadonlyArray<PlacedExecutor>,
    onProgress: (message: string) => Effect.Effect<void>,
    failedOn?: Set<string>
  ) =>
    Effect.suspend(() => {
      const kind = kinds.get(spec.kind)!
      const prepare = kind.prepare
      if (prepare === undefined) return Effect.void
      const nodes = [...new Set(placed.map((executor) => executor.node))]
      return Effect.forEach(
        nodes,
        (name) => {
          const node = registry.handle(name)
          return node === undefined
            ? Effect.fail(new DeploymentFailed({ message: `task ${spec.id} failed to start: node ${name} is gone` }))
            : prepare(spec, node, onProgress).pipe(
                Effect.tapError((error) => noteFailure(error, failedOn)),
                Effect.mapError(
                  (error) => new DeploymentFailed({ message: `task ${spec.id} failed to start: ${error.message}` })
                )
              )
        },
        { concurrency: "unbounded", discard: true }
      )
    })

  return { placementNodes, preferredFor, noteFailure, startedOn, placeExecutors, groupsOf, logPlacement, prepareOn }
}

export type LivePlacement = ReturnType<typeof makeLivePlacement>
