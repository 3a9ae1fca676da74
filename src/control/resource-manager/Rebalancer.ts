import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import { ScalingBounds } from "../../app-runtime/tasks/Task.js"
import { ServeConfig } from "../../config/ServeConfig.js"
import { capacityOf, sustainedOf } from "../task-manager/TaskProfile.js"
import { defaultRebalancePolicy, planMoves, type RebalanceTask } from "./Rebalance.js"
import type { TaskOnDevices } from "./RebalanceMoves.js"
import { ResourceManager } from "./ResourceManager.js"

/** A task's bounds on its executors, as its config gives them (its kind's config schema checked them at registration). */
const ExecutorBounds = Schema.Struct(ScalingBounds)
const boundsOf = (config: unknown) =>
  Option.getOrElse(Schema.decodeUnknownOption(ExecutorBounds)(config), (): typeof ExecutorBounds.Type => ({}))

/**
 * Rebalancing (`cornserve serve --autoscale`): each round reads every task's mean load and arrival
 * rate since the last round, and what one executor sustains from its profile (recorded ahead of
 * time, else measured online once it shows saturation), then has the resource manager make the
 * moves the policy (Rebalance.ts) asks for. Without `--autoscale` it does nothing.
 *
 * A round reads the tasks and plans under the resource manager's lock, then makes its moves one
 * at a time, each under the lock for its own drain and start only: a registration or a `tasks
 * scale` waits for one move, not for the whole round. A move that fails (a registration took the
 * devices it counted on, say) is logged, and the round goes on with the others.
 *
 * The service is its loop: it offers nothing to call. The resource manager, which makes the moves,
 * counts them (`rebalanceMoves`).
 */
export class Rebalancer extends Effect.Service<Rebalancer>()("cornserve/Rebalancer", {
  scoped: Effect.gen(function* () {
    const config = yield* ServeConfig
    const resources = yield* ResourceManager
    const lastReading = new Map<string, { readonly area: number; readonly arrived: number; readonly at: number }>()

    /** A task as the policy sees it: its devices, as the resource manager holds them, and its load since the last round. */
    const readTask = (now: number, { task, ...onDevices }: TaskOnDevices): RebalanceTask => {
      const area = task.loadArea()
      const online = task.profile()
      // Counted as calls ask for an executor: a round in which no call ends still sees its arrivals.
      const arrived = task.arrived
      const previous = lastReading.get(task.spec.id)
      lastReading.set(task.spec.id, { area, arrived, at: now })
      const span = previous === undefined ? 0 : now - previous.at
      const bounds = boundsOf(task.spec.config)
      const recorded = task.recorded()
      const profiles = recorded === undefined ? [online] : [recorded, online]
      return {
        id: task.spec.id,
        executors: task.executors().length,
        ...onDevices,
        minExecutors: bounds.minExecutors ?? 1,
        maxExecutors: bounds.maxExecutors ?? Number.POSITIVE_INFINITY,
        meanLoad: span <= 0 ? 0 : (area - previous!.area) / span,
        rate: span <= 0 ? undefined : ((arrived - previous!.arrived) * 1000) / span,
        capacity: profiles.map(capacityOf).find((capacity) => capacity !== undefined),
        // Online measurements where there are any, else the recorded ones, per executor count.
        sustained: [
          ...new Map(
            profiles.flatMap((profile) =>
              sustainedOf(profile).map((curve) => [curve.executors, curve.callsPerSecond] as const)
            )
          )
        ]
      }
    }

    const round = Effect.gen(function* () {
      const plan = yield* resources.survey((fleet) => {
        const now = performance.now()
        // A task just changed waits three rounds: its new executor is measured before the next move.
        return planMoves(
          {
            now: Date.now(),
            tasks: fleet.tasks.map((task) => readTask(now, task)),
            freeDevices: fleet.freeByNode.reduce((sum, count) => sum + count, 0),
            freeByNode: fleet.freeByNode,
            cpuDevices: fleet.cpuDevices
          },
          { ...defaultRebalancePolicy, cooldownMs: 3 * (config.autoscaleIntervalMs ?? 0) }
        )
      })
      for (const move of plan) {
        yield* Effect.logInfo(`rebalancing: ${move.reason}`)
        yield* resources
          .move(move)
          .pipe(Effect.catchAll((error) => Effect.logWarning(`rebalancing: the move failed: ${error.message}`)))
      }
    })

    if (config.autoscaleIntervalMs !== undefined) {
      yield* round.pipe(
        // A round that dies of a defect is logged; the next round runs all the same.
        Effect.catchAllCause((cause) => Effect.logError("rebalancing: the round failed", cause)),
        Effect.repeat(Schedule.spaced(Duration.millis(config.autoscaleIntervalMs))),
        Effect.forkScoped
      )
    }
    return {}
  }),
  dependencies: [ResourceManager.Default]
}) {}
