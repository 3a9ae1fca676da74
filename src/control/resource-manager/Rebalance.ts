/**
 * Which devices move between the tasks of a fixed pool: a pure policy over plain data (the tasks'
 * executors and bounds, their load and profiles, free devices, when each was last changed),
 * answering the moves of one round, each with its reason. The live rebalancer (Rebalancer.ts) and
 * the bench's simulation of a fleet (`npm run bench -- resources`) both run it.
 *
 * A task's need is measured one of two ways:
 *
 * - **By its profile**, when the profile knows what one executor sustains (`capacity`, calls/s):
 *   its utilisation is the arrival rate over what its executors sustain. Above `growAbove` it is a
 *   bottleneck and needs executors enough to run at `targetUtilization`; below `shrinkBelow` it has
 *   slack down to that same utilisation. One round can move many devices: a task that needs ten
 *   more gets ten.
 * - **By its load alone**, when it does not: calls in flight per executor. Above `high` it is a
 *   bottleneck and needs one executor more (it cannot be sized without a profile); below `low` it
 *   has one executor of slack.
 *
 * Bottlenecks are served widest first (the highest utilisation, or pressure): on free devices while
 * there are any, then on devices taken from the tasks with the most slack (their executors drain
 * first), then, for a task on CPU devices, by sharing a CPU device it does not hold yet where every
 * task already on it is calm (below `shrinkBelow`, or `low`): on a host whose cores are all shared,
 * that is how a bottleneck gets another core while the tasks on it idle. An executor a task runs on
 * a shared device goes back once the task has slack, so that its calls batch in fewer executors
 * again. Hysteresis: the gap between the thresholds, and a cooldown during which a task just
 * changed is not changed again, so that one burst does not move devices back and forth. Bounds: a
 * task keeps `min` executors and never exceeds `max`.
 */

export interface RebalanceTask {
  readonly id: string
  readonly executors: number
  readonly devicesPerExecutor: number
  readonly minExecutors: number
  readonly maxExecutors: number
  /** Mean calls in flight in the task over the last window (all its executors together). */
  readonly meanLoad: number
  /** Calls per second that arrived over the last window, those refused included. */
  readonly rate?: number | undefined
  /** Calls per second one executor sustains, from the task's profile; undefined: not known. */
  readonly capacity?: number | undefined
  /**
   * Calls per second the whole task sustained at each executor count its profile measured to
   * saturation: where more executors did not raise it, the task does not grow past them.
   */
  readonly sustained?: ReadonlyArray<readonly [executors: number, callsPerSecond: number]> | undefined
  /** When the task was last grown or shrunk (by this policy or by hand), ms; undefined: never. */
  readonly changedAt: number | undefined
  /** Its executors on devices that other tasks hold too (they free no device when they go); 0 when absent. */
  readonly sharing?: number | undefined
  /** Its executors run on CPU devices: it may grow onto a CPU device other tasks hold. */
  readonly mayShare?: boolean | undefined
}

/** A CPU device executors of several tasks may share, and the tasks holding it. */
export interface SharedDevice {
  readonly node: string
  readonly id: string
  readonly tasks: ReadonlyArray<string>
}

export interface RebalanceState {
  readonly now: number
  readonly tasks: ReadonlyArray<RebalanceTask>
  /** Devices no task holds, on all ready nodes. */
  readonly freeDevices: number
  /**
   * The same, node by node, when there are several: an executor's devices must all be on one node,
   * so a task grows on free devices only where one node has enough. Absent: one node.
   */
  readonly freeByNode?: ReadonlyArray<number>
  /** CPU devices on ready nodes, in each node's order, with the tasks holding them: where a task may share. */
  readonly cpuDevices?: ReadonlyArray<SharedDevice>
}

export interface RebalancePolicy {
  /** Without a profile: calls in flight per executor above which a task is a bottleneck. */
  readonly high: number
  /** Without a profile: calls in flight per executor below which a task has slack to give. */
  readonly low: number
  /** With a profile: the utilisation above which a task is a bottleneck. */
  readonly growAbove: number
  /** With a profile: the utilisation below which a task has slack to give. */
  readonly shrinkBelow: number
  /** With a profile: the utilisation a task is sized for when it grows or gives. */
  readonly targetUtilization: number
  /** How long a task just changed is left alone. */
  readonly cooldownMs: number
  /** The gain in sustained calls/s an executor more must have shown for a task to grow past it. */
  readonly minGain: number
}

export const defaultRebalancePolicy: RebalancePolicy = {
  high: 2,
  low: 0.5,
  growAbove: 0.85,
  shrinkBelow: 0.5,
  targetUtilization: 0.7,
  cooldownMs: 15_000,
  minGain: 0.1
}

export type Move =
  | { readonly _tag: "Grow"; readonly task: string; readonly reason: string }
  /** The task gives back one executor that did not raise its throughput (it drains first). */
  | { readonly _tag: "Release"; readonly task: string; readonly reason: string }
  /** Each task of `from` gives one executor (it drains first); `to` grows by one on their devices. */
  | { readonly _tag: "Take"; readonly from: ReadonlyArray<string>; readonly to: string; readonly reason: string }
  /** The task grows by one executor on `devices` of `node`, which calm tasks hold: it shares them. */
  | {
      readonly _tag: "Share"
      readonly task: string
      readonly node: string
      readonly devices: ReadonlyArray<string>
      readonly reason: string
    }
  /** The task has slack and gives back one executor it runs on a shared device (it drains first). */
  | { readonly _tag: "Unshare"; readonly task: string; readonly reason: string }

export const pressureOf = (task: RebalanceTask) => task.meanLoad / Math.max(1, task.executors)

const profiled = (task: RebalanceTask): task is RebalanceTask & { rate: number; capacity: number } =>
  task.rate !== undefined && task.capacity !== undefined && task.capacity > 0

/** Arrivals over what `executors` executors sustain. */
const utilizationAt = (task: RebalanceTask & { rate: number; capacity: number }, executors: number) =>
  task.rate / (task.capacity * Math.max(1, executors))

const fixed = (value: number) => value.toFixed(2)

interface Assessed {
  readonly task: RebalanceTask
  /** Executors past what its profile showed any gain from, and why; 0: none. */
  readonly past: number
  readonly ceilingWhy: string
  /** Executors more it wants (bottlenecks) or can give (slack); 0: neither. */
  readonly wants: number
  readonly gives: number
  /**
   * Executors it can lend to an overloaded task (arrivals above what its executors sustain) when
   * slack is not enough: as many as leave it under `growAbove` with a margin.
   */
  readonly spares: number
  /** How hard it is pressed: utilisation, or calls in flight per executor over `high`. */
  readonly severity: number
  /** Below `shrinkBelow` (or `low`): a device it holds may take a bottleneck's executor too. */
  readonly calm: boolean
  /** Why it wants or gives, for the log. */
  readonly why: string
}

/**
 * The executors past which the task's profile showed no gain: the fewest that sustained within
 * `minGain` of every larger count it measured. Undefined when no larger count was measured.
 */
export const ceilingOf = (
  sustained: ReadonlyArray<readonly [number, number]>,
  minGain: number
): { readonly executors: number; readonly why: string } | undefined => {
  const sorted = [...sustained].sort(([a], [b]) => a - b)
  for (const [index, [executors, rate]] of sorted.entries()) {
    const larger = sorted.slice(index + 1)
    if (larger.length === 0) return undefined
    if (larger.every(([, more]) => more <= (1 + minGain) * rate)) {
      const [most, mostRate] = larger.reduce((top, entry) => (entry[1] > top[1] ? entry : top))
      return {
        executors,
        why: `${executors} executor(s) sustained ${fixed(rate)} calls/s and ${most} sustained ${fixed(mostRate)}`
      }
    }
  }
  return undefined
}

const assess = (task: RebalanceTask, policy: RebalancePolicy): Assessed => {
  const ceiling = task.sustained === undefined ? undefined : ceilingOf(task.sustained, policy.minGain)
  const top = Math.min(task.maxExecutors, Math.max(task.minExecutors, ceiling?.executors ?? Number.POSITIVE_INFINITY))
  const bounded = (executors: number) => Math.min(top, Math.max(task.minExecutors, executors))
  const past = Math.max(0, task.executors - top)
  const nothing = { task, wants: 0, gives: 0, spares: 0, past, ceilingWhy: ceiling?.why ?? "" }
  if (profiled(task)) {
    const utilization = utilizationAt(task, task.executors)
    const sized = bounded(Math.ceil(task.rate / (task.capacity * policy.targetUtilization)))
    const why = `${fixed(task.rate)} calls/s against ${fixed(task.capacity)} per executor (${task.executors} executor(s), utilisation ${fixed(utilization)})`
    const calm = utilization < policy.shrinkBelow
    if (past > 0) return { ...nothing, severity: utilization, calm, why }
    let spares = 0
    while (
      task.executors - spares > task.minExecutors &&
      utilizationAt(task, task.executors - spares - 1) <= spareBelow * policy.growAbove
    )
      spares++
    return {
      ...nothing,
      wants: utilization > policy.growAbove ? Math.max(0, sized - task.executors) : 0,
      gives: utilization < policy.shrinkBelow ? Math.max(0, task.executors - sized) : 0,
      spares,
      severity: utilization,
      calm,
      why
    }
  }
  const pressure = pressureOf(task)
  const above = pressure > policy.high
  const why = above
    ? `${fixed(pressure)} calls in flight per executor (above ${policy.high})`
    : `${fixed(pressure)} per executor (below ${policy.low})`
  const calm = pressure < policy.low
  if (past > 0) return { ...nothing, severity: pressure / policy.high, calm, why }
  return {
    ...nothing,
    wants: above && task.executors < top ? 1 : 0,
    gives: calm && task.executors > task.minExecutors ? 1 : 0,
    severity: pressure / policy.high,
    calm,
    why
  }
}

/** A task lends executors only while it stays this far under `growAbove`: it must not become a bottleneck. */
const spareBelow = 0.95

const byId = (a: RebalanceTask, b: RebalanceTask) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0)

/**
 * The moves of one round, in the order to make them: first the executors that did not raise their
 * task's throughput go back to the pool; then every bottleneck's executors, on free devices first,
 * then on devices taken from slack, then on CPU devices shared with calm tasks; last, tasks with
 * slack left give back executors they run on shared devices. A donor's executor gives its devices
 * to the pool (only one that holds its devices alone frees any); they go to a bottleneck once the
 * pool holds enough for one executor of it.
 */
export const planMoves = (
  state: RebalanceState,
  policy: RebalancePolicy = defaultRebalancePolicy
): ReadonlyArray<Move> => {
  const settled = (task: RebalanceTask) =>
    task.changedAt === undefined || state.now - task.changedAt >= policy.cooldownMs
  const everyTask = state.tasks.map((task) => assess(task, policy))
  const assessed = everyTask.filter((entry) => settled(entry.task))
  const calm = new Set(everyTask.filter((entry) => entry.calm).map((entry) => entry.task.id))
  const bottlenecks = assessed
    .filter((entry) => entry.wants > 0)
    .sort((a, b) => b.severity - a.severity || byId(a.task, b.task))
  const donors = assessed
    .filter((entry) => entry.gives > 0 || entry.spares > 0)
    .sort((a, b) => a.severity - b.severity || byId(a.task, b.task))
  const given = new Map<string, number>()
  let free = state.freeDevices
  // Free devices per node, for growing on them: the node that fits an executor most tightly gives
  // its devices. On several nodes, devices released or given by donors this round count in `free`
  // only (which node they come back on is the resource manager's choice), and no node counts more
  // than `free`; on one node they are that node's.
  const nodesFree = [...(state.freeByNode ?? [state.freeDevices])]
  const oneNode = nodesFree.length === 1
  const takeFree = (needs: number): boolean => {
    let chosen = -1
    for (const [index, count] of nodesFree.entries())
      if (count >= needs && (chosen < 0 || count < nodesFree[chosen]!)) chosen = index
    if (chosen < 0 || free < needs) return false
    nodesFree[chosen]! -= needs
    free -= needs
    return true
  }
  const moves: Array<Move> = []
  for (const entry of assessed) {
    for (let released = 0; released < entry.past; released++) {
      free += entry.task.devicesPerExecutor
      if (oneNode) nodesFree[0]! += entry.task.devicesPerExecutor
      moves.push({
        _tag: "Release",
        task: entry.task.id,
        reason: `${entry.task.id} gains nothing from its ${entry.task.executors} executors: ${entry.ceilingWhy}; one goes back to the pool`
      })
    }
  }
  // The tasks on each CPU device, with the bottlenecks that share it this round: a device a
  // bottleneck just took is no longer calm.
  const holders = new Map<SharedDevice, Set<string>>(
    (state.cpuDevices ?? []).map((device) => [device, new Set(device.tasks)])
  )
  /** `needs` CPU devices on one node that `taskId` does not hold and only calm tasks do, the least shared. */
  const shareFor = (taskId: string, needs: number) => {
    type Open = { readonly device: SharedDevice; readonly held: Set<string> }
    const byNode = new Map<string, Array<Open>>()
    for (const [device, held] of holders) {
      if (held.has(taskId) || [...held].some((other) => !calm.has(other))) continue
      byNode.set(device.node, [...(byNode.get(device.node) ?? []), { device, held }])
    }
    let best: { readonly node: string; readonly chosen: ReadonlyArray<Open>; readonly sharers: number } | undefined
    for (const [node, candidates] of byNode) {
      if (candidates.length < needs) continue
      const chosen = [...candidates].sort((a, b) => a.held.size - b.held.size).slice(0, needs)
      const sharers = chosen.reduce((sum, entry) => sum + entry.held.size, 0)
      if (best === undefined || sharers < best.sharers) best = { node, chosen, sharers }
    }
    if (best === undefined) return undefined
    const tasksOn = [...new Set(best.chosen.flatMap((entry) => [...entry.held]))]
    for (const entry of best.chosen) entry.held.add(taskId)
    return { node: best.node, devices: best.chosen.map((entry) => entry.device.id), tasksOn }
  }
  for (const bottleneck of bottlenecks) {
    const { task } = bottleneck
    const needs = task.devicesPerExecutor
    for (let grown = 0; grown < bottleneck.wants; grown++) {
      if (takeFree(needs)) {
        moves.push({
          _tag: "Grow",
          task: task.id,
          reason: `${task.id} is a bottleneck: ${bottleneck.why}; a free device takes it`
        })
        continue
      }
      // Donors, least pressed first, each giving executors while it has slack (or, to a task that
      // is overloaded, spare), until the pool holds one executor's devices of the bottleneck.
      const overloaded = profiled(task) && utilizationAt(task, task.executors + grown) > 1
      const taken: Array<Assessed> = []
      // The free devices that can join the donors' in one executor: on several nodes, one node's
      // at most (the roomiest: donors' executors there are the resource manager's first choice).
      const roomiest = oneNode
        ? 0
        : nodesFree.reduce((best, count, index) => (count > nodesFree[best]! ? index : best), 0)
      const start = Math.min(free, nodesFree[roomiest] ?? 0)
      let pool = start
      for (const donor of donors) {
        if (donor.task.id === task.id) continue
        // Only an executor that holds its devices alone frees any.
        const alone = donor.task.executors - (donor.task.sharing ?? 0)
        const asked = given.get(donor.task.id) ?? 0
        let left = Math.min((overloaded ? Math.max(donor.gives, donor.spares) : donor.gives) - asked, alone - asked)
        while (left > 0 && pool < needs) {
          taken.push(donor)
          pool += donor.task.devicesPerExecutor
          left--
        }
        if (pool >= needs) break
      }
      if (pool < needs) {
        const shared = task.mayShare === true ? shareFor(task.id, needs) : undefined
        if (shared === undefined) break
        moves.push({
          _tag: "Share",
          task: task.id,
          node: shared.node,
          devices: shared.devices,
          reason: `${task.id} is a bottleneck: ${bottleneck.why}; no device is free or taken from slack, and ${shared.devices.join(", ")} ${shared.tasksOn.length === 0 ? "is free" : `holds only calm tasks (${shared.tasksOn.join(", ")})`}: it shares ${shared.devices.length === 1 ? "it" : "them"}`
        })
        continue
      }
      for (const donor of taken) given.set(donor.task.id, (given.get(donor.task.id) ?? 0) + 1)
      // The executor takes the donors' devices first, then free ones; donors' devices left over are free.
      const donated = pool - start
      const usedFree = Math.max(0, needs - donated)
      free += donated - needs
      if (oneNode) nodesFree[0] = free
      else {
        if (nodesFree.length > 0) nodesFree[roomiest]! -= usedFree
        for (const [index, count] of nodesFree.entries()) nodesFree[index] = Math.min(count, free)
      }
      moves.push({
        _tag: "Take",
        from: taken.map((donor) => donor.task.id),
        to: task.id,
        reason: `${task.id} is a bottleneck: ${bottleneck.why}; ${[...new Set(taken)]
          .map((donor) => `${donor.task.id} has ${donor.gives > 0 ? "slack" : "executors to spare"}: ${donor.why}`)
          .join("; ")}`
      })
    }
  }
  // What slack is left after the bottlenecks took theirs: executors on shared devices go back.
  for (const entry of assessed) {
    const back = Math.min(entry.gives - (given.get(entry.task.id) ?? 0), entry.task.sharing ?? 0)
    for (let index = 0; index < back; index++) {
      moves.push({
        _tag: "Unshare",
        task: entry.task.id,
        reason: `${entry.task.id} has slack: ${entry.why}; an executor it runs on a shared device goes back`
      })
    }
  }
  return moves
}

/** The first move of the round, if any: for callers that make one move at a time. */
export const decideMove = (state: RebalanceState, policy: RebalancePolicy = defaultRebalancePolicy): Move | undefined =>
  planMoves(state, policy)[0]
