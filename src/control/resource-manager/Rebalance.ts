/**
 * Which device moves next between the tasks of a fixed pool: a pure policy over plain data (the
 * tasks' executors and bounds, their load, free devices, when each was last changed), answering at
 * most one move per round, with its reason.
 *
 * A task's pressure is the calls it had in flight on average over the last window, per executor.
 * Above `high` it is a bottleneck; below `low` it has slack. The widest bottleneck grows first: on
 * a free device when there is one, else on a device taken from the task with the most slack (that
 * executor drains first). Hysteresis: the gap between `low` and `high`, and a cooldown during which
 * a task just changed is not changed again, so that one burst does not move devices back and
 * forth. Bounds: a task keeps `min` executors and never exceeds `max`.
 */

export interface RebalanceTask {
  readonly id: string
  readonly executors: number
  readonly devicesPerExecutor: number
  readonly minExecutors: number
  readonly maxExecutors: number
  /** Mean calls in flight in the task over the last window (all its executors together). */
  readonly meanLoad: number
  /** When the task was last grown or shrunk (by this policy or by hand), ms; undefined: never. */
  readonly changedAt: number | undefined
}

export interface RebalanceState {
  readonly now: number
  readonly tasks: ReadonlyArray<RebalanceTask>
  /** Devices no task holds, on all ready nodes. */
  readonly freeDevices: number
}

export interface RebalancePolicy {
  /** Calls in flight per executor above which a task is a bottleneck. */
  readonly high: number
  /** Calls in flight per executor below which a task has slack to give. */
  readonly low: number
  /** How long a task just changed is left alone. */
  readonly cooldownMs: number
}

export const defaultRebalancePolicy: RebalancePolicy = { high: 2, low: 0.5, cooldownMs: 15_000 }

export type Move =
  | { readonly _tag: "Grow"; readonly task: string; readonly reason: string }
  | { readonly _tag: "Take"; readonly from: string; readonly to: string; readonly reason: string }

export const pressureOf = (task: RebalanceTask) => task.meanLoad / Math.max(1, task.executors)

const fixed = (value: number) => value.toFixed(2)

export const decideMove = (
  state: RebalanceState,
  policy: RebalancePolicy = defaultRebalancePolicy
): Move | undefined => {
  const settled = (task: RebalanceTask) =>
    task.changedAt === undefined || state.now - task.changedAt >= policy.cooldownMs
  const bottlenecks = state.tasks
    .filter((task) => settled(task) && task.executors < task.maxExecutors && pressureOf(task) > policy.high)
    .sort((a, b) => pressureOf(b) - pressureOf(a) || (a.id < b.id ? -1 : 1))
  for (const task of bottlenecks) {
    const pressure = `${fixed(pressureOf(task))} calls in flight per executor (above ${policy.high})`
    if (state.freeDevices >= task.devicesPerExecutor) {
      return { _tag: "Grow", task: task.id, reason: `${task.id} is a bottleneck: ${pressure}; a free device takes it` }
    }
    // A donor gives one executor's devices; they must be enough for one executor of the bottleneck.
    const donors = state.tasks
      .filter(
        (donor) =>
          donor.id !== task.id &&
          settled(donor) &&
          donor.executors > donor.minExecutors &&
          pressureOf(donor) < policy.low &&
          donor.devicesPerExecutor + state.freeDevices >= task.devicesPerExecutor
      )
      .sort((a, b) => pressureOf(a) - pressureOf(b) || (a.id < b.id ? -1 : 1))
    const donor = donors[0]
    if (donor !== undefined) {
      return {
        _tag: "Take",
        from: donor.id,
        to: task.id,
        reason: `${task.id} is a bottleneck: ${pressure}; ${donor.id} has slack: ${fixed(pressureOf(donor))} per executor (below ${policy.low})`
      }
    }
  }
  return undefined
}
