/**
 * A discrete-event simulation of a fixed device pool under a shifting load, driven by the same
 * rebalancing policy as the live rebalancer (`planMoves` of Rebalance.ts), and the search for
 * the best static split it is weighed against.
 *
 * The model:
 * - **Tasks** are served by executors of `devicesPerExecutor` devices each. An executor takes up to
 *   `maxBatch` waiting calls from its task's queue at once and serves them in
 *   `baseMs + perItemMs × batch` (the task's profile). A task refuses a call when its queue holds
 *   `queuePerExecutor` calls per executor already (the platform's per-task bound).
 * - **Apps** are chains of tasks (an image chat: an encoder, then an LLM). A request meets its
 *   target when it passes every stage within `targetMs` of its arrival; goodput is the requests
 *   that do.
 * - **The load** is a list of phases, each with a rate per app and bursts (one app's rate times a
 *   factor for a while). Arrivals are Poisson, drawn once from a seeded generator, so that every
 *   run of a phase sees the very same requests.
 * - **Moves** take time, as they do live: a device leaves a task only after its executor has
 *   drained, and a new executor takes calls only `startupMs` after it was placed.
 * - **Shared capacity** (optional, `effectiveExecutors`): a task whose executors share what limits
 *   them (a host's cores or memory bandwidth) serves no faster with more than that many busy at
 *   once: each batch takes longer by busy executors over `effectiveExecutors`. The policy then sees
 *   what the task sustained at each executor count it ran, as a live profile shows it, and gives
 *   back the executors that added nothing.
 * - **The policy** runs every `roundMs`, reading each task's mean calls in flight and arrival rate
 *   over the round, and the capacity its profile shows (`capacityOf` over the profile's curve, as
 *   live), with a cooldown of three rounds, as live.
 */
import { type CurvePoint, capacityOf } from "../../src/control/task-manager/TaskProfile.js"
import {
  defaultRebalancePolicy,
  planMoves,
  type RebalancePolicy,
  type RebalanceTask
} from "../../src/control/resource-manager/Rebalance.js"

export interface SimTaskSpec {
  readonly id: string
  readonly devicesPerExecutor: number
  readonly maxBatch: number
  readonly baseMs: number
  readonly perItemMs: number
  readonly minExecutors: number
  readonly maxExecutors: number
  /** From placement to taking calls: the executor starts and loads its model. */
  readonly startupMs: number
  /** Executors past this many, busy at once, add no throughput; absent: every executor adds its own. */
  readonly effectiveExecutors?: number
}

export interface SimApp {
  readonly id: string
  /** The tasks a request passes through, in order. */
  readonly stages: ReadonlyArray<string>
  readonly targetMs: number
}

export interface Burst {
  readonly app: string
  /** From the start of its phase. */
  readonly atMs: number
  readonly durationMs: number
  readonly factor: number
}

export interface LoadPhase {
  readonly name: string
  readonly durationMs: number
  /** Requests per second per app (apps not named: none). */
  readonly rates: Readonly<Record<string, number>>
  readonly bursts: ReadonlyArray<Burst>
}

export interface Scenario {
  readonly devices: number
  readonly tasks: ReadonlyArray<SimTaskSpec>
  readonly apps: ReadonlyArray<SimApp>
  readonly phases: ReadonlyArray<LoadPhase>
  readonly queuePerExecutor: number
  readonly seed: number
}

/** Executors per task. */
export type Split = Readonly<Record<string, number>>

export interface PhaseResult {
  readonly name: string
  readonly requests: number
  readonly good: number
  readonly refused: number
  /** good / requests. */
  readonly goodput: number
}

export interface TaskResult {
  /** Requests lost (refused, or late) at this task: the stage where a late request waited longest. */
  readonly lost: number
  /** Busy executor time over executor time. */
  readonly utilization: number
}

export interface SimResult {
  readonly phases: ReadonlyArray<PhaseResult>
  readonly tasks: Readonly<Record<string, TaskResult>>
  /** Moves the policy made (Grow, Take and Release), and devices moved. */
  readonly moves: number
  readonly devicesMoved: number
  /** Executors given back by Release moves: they had added no throughput. */
  readonly released: number
  /** Mean executors per task over each phase. */
  readonly meanSplit: ReadonlyArray<Split>
  readonly events: number
}

/** The profile a task shows: its throughput–latency curve at load levels 1, 2, 4, ... 4 × maxBatch. */
export const profileCurve = (task: SimTaskSpec): ReadonlyArray<CurvePoint> => {
  const points: Array<CurvePoint> = []
  for (let level = 1; level <= 4 * task.maxBatch; level *= 2) {
    const batch = Math.min(level, task.maxBatch)
    const serviceMs = task.baseMs + task.perItemMs * batch
    // A closed loop of `level` calls: full batches one after another; a call waits for the ones ahead.
    const meanMs = serviceMs * Math.ceil(level / batch)
    points.push({
      levelFrom: level,
      levelTo: level,
      meanLevel: level,
      calls: 1000,
      p50Ms: meanMs,
      p95Ms: meanMs,
      p99Ms: meanMs,
      meanMs,
      callsPerSecond: level / (meanMs / 1000)
    })
  }
  return points
}

/** Calls per second one executor of the task sustains, read from its profile as live. */
export const capacityOfTask = (task: SimTaskSpec) =>
  capacityOf({ curves: [{ executors: 1, points: profileCurve(task) }] })!

// ---------------------------------------------------------------------------------------------
// Random numbers and arrivals

/** mulberry32: small, fast, seeded. */
const generator = (seed: number) => {
  let state = seed >>> 0
  return () => {
    state = (state + 0x6d2b79f5) >>> 0
    let t = state
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

const hash = (text: string) => {
  let value = 2166136261
  for (let i = 0; i < text.length; i++) value = Math.imul(value ^ text.charCodeAt(i), 16777619)
  return value >>> 0
}

/** The rate of an app over a phase, in pieces: [fromMs, toMs, rate per second]. */
const ratePieces = (phase: LoadPhase, app: string): ReadonlyArray<readonly [number, number, number]> => {
  const base = phase.rates[app] ?? 0
  const cuts = new Set([0, phase.durationMs])
  for (const burst of phase.bursts) {
    if (burst.app !== app) continue
    cuts.add(Math.max(0, burst.atMs))
    cuts.add(Math.min(phase.durationMs, burst.atMs + burst.durationMs))
  }
  const sorted = [...cuts].sort((a, b) => a - b)
  const pieces: Array<readonly [number, number, number]> = []
  for (let i = 0; i + 1 < sorted.length; i++) {
    const [from, to] = [sorted[i]!, sorted[i + 1]!]
    const factor = phase.bursts
      .filter((burst) => burst.app === app && burst.atMs <= from && burst.atMs + burst.durationMs >= to)
      .reduce((product, burst) => product * burst.factor, 1)
    pieces.push([from, to, base * factor])
  }
  return pieces
}

/** Arrival times (ms from the phase's start) of each app in a phase: the same for every run. */
const arrivalsOf = (scenario: Scenario, phaseIndex: number): ReadonlyMap<string, Float64Array> => {
  const phase = scenario.phases[phaseIndex]!
  const out = new Map<string, Float64Array>()
  for (const app of scenario.apps) {
    const random = generator(scenario.seed ^ hash(`${phaseIndex}/${app.id}`))
    const times: Array<number> = []
    for (const [from, to, rate] of ratePieces(phase, app.id)) {
      if (rate <= 0) continue
      let t = from
      for (;;) {
        t += (-Math.log(1 - random()) / rate) * 1000
        if (t >= to) break
        times.push(t)
      }
    }
    out.set(app.id, Float64Array.from(times))
  }
  return out
}

/** Phase-average calls per second reaching each task. */
export const taskRates = (scenario: Scenario, phase: LoadPhase): ReadonlyMap<string, number> => {
  const rates = new Map<string, number>(scenario.tasks.map((task) => [task.id, 0]))
  for (const app of scenario.apps) {
    const calls = ratePieces(phase, app.id).reduce((sum, [from, to, rate]) => sum + (rate * (to - from)) / 1000, 0)
    for (const stage of app.stages) rates.set(stage, rates.get(stage)! + calls / (phase.durationMs / 1000))
  }
  return rates
}

// ---------------------------------------------------------------------------------------------
// The event loop

interface Request {
  readonly app: number
  readonly phase: number
  readonly arrivedAt: number
  stage: number
  enqueuedAt: number
  /** The stage where it waited longest, and how long. */
  worstStage: number
  worstWait: number
}

interface Executor {
  readonly task: TaskState
  state: "starting" | "active" | "draining" | "gone"
  busy: boolean
  batch: Array<Request>
  busySince: number
}

interface TaskState {
  readonly index: number
  readonly spec: SimTaskSpec
  readonly capacity: number
  queue: Array<Request>
  head: number
  readonly executors: Array<Executor>
  readonly idle: Array<Executor>
  /** Executors placed but waiting for devices (taken from a donor that is draining). */
  pending: number
  /** Executors starting or active (not draining). */
  live: number
  inFlight: number
  area: number
  areaAt: number
  arrived: number
  busyMs: number
  lost: number
  changedAt: number | undefined
  /** Executors busy now. */
  busy: number
  /** The executor counts the task has run at (kept for tasks of shared capacity only). */
  readonly ranAt: Set<number>
}

type Event =
  | { readonly t: number; readonly seq: number; readonly kind: "arrive"; readonly app: number }
  | { readonly t: number; readonly seq: number; readonly kind: "done"; readonly executor: Executor }
  | { readonly t: number; readonly seq: number; readonly kind: "ready"; readonly executor: Executor }
  | { readonly t: number; readonly seq: number; readonly kind: "round" }
  | { readonly t: number; readonly seq: number; readonly kind: "sample" }

/** A binary min-heap of events by time, then by order of scheduling. */
class EventQueue {
  private readonly items: Array<Event> = []
  get size() {
    return this.items.length
  }
  push(event: Event) {
    const items = this.items
    items.push(event)
    let i = items.length - 1
    while (i > 0) {
      const parent = (i - 1) >> 1
      if (!before(items[i]!, items[parent]!)) break
      ;[items[i], items[parent]] = [items[parent]!, items[i]!]
      i = parent
    }
  }
  pop(): Event | undefined {
    const items = this.items
    const top = items[0]
    const last = items.pop()
    if (items.length > 0 && last !== undefined) {
      items[0] = last
      let i = 0
      for (;;) {
        const left = 2 * i + 1
        const right = left + 1
        let least = i
        if (left < items.length && before(items[left]!, items[least]!)) least = left
        if (right < items.length && before(items[right]!, items[least]!)) least = right
        if (least === i) break
        ;[items[i], items[least]] = [items[least]!, items[i]!]
        i = least
      }
    }
    return top
  }
}

const before = (a: Event, b: Event) => a.t < b.t || (a.t === b.t && a.seq < b.seq)

export interface RunOptions {
  /** The phases to run, in order (default: all). */
  readonly phases?: ReadonlyArray<number>
  /** Executors per task at the start (every one ready). */
  readonly split: Split
  /** Rebalance with this policy every `roundMs`; absent: the split stays fixed. */
  readonly policy?: { readonly rules: RebalancePolicy; readonly roundMs: number } | undefined
}

export const defaultSimPolicy = (roundMs: number) => ({
  rules: { ...defaultRebalancePolicy, cooldownMs: 3 * roundMs },
  roundMs
})

/** Runs the scenario's phases back to back from `split`, under the policy or fixed. */
export const simulate = (scenario: Scenario, options: RunOptions): SimResult => {
  const phaseIndices = options.phases ?? scenario.phases.map((_, index) => index)
  const starts: Array<number> = []
  let end = 0
  for (const index of phaseIndices) {
    starts.push(end)
    end += scenario.phases[index]!.durationMs
  }
  const taskIndex = new Map(scenario.tasks.map((task, index) => [task.id, index]))
  const tasks: Array<TaskState> = scenario.tasks.map((spec, index) => ({
    index,
    spec,
    capacity: capacityOfTask(spec),
    queue: [],
    head: 0,
    executors: [],
    idle: [],
    pending: 0,
    live: 0,
    inFlight: 0,
    area: 0,
    areaAt: 0,
    arrived: 0,
    busyMs: 0,
    lost: 0,
    changedAt: undefined,
    busy: 0,
    ranAt: new Set()
  }))
  const apps = scenario.apps.map((app) => ({ ...app, stageIndex: app.stages.map((stage) => taskIndex.get(stage)!) }))
  const events = new EventQueue()
  let seq = 0
  let now = 0
  let handled = 0
  let moves = 0
  let devicesMoved = 0
  let released = 0
  const phaseCounts = phaseIndices.map(() => ({ requests: 0, good: 0, refused: 0 }))
  const splitArea = phaseIndices.map(() => new Float64Array(tasks.length))

  let held = 0

  const countLoad = (task: TaskState, delta: number) => {
    task.area += task.inFlight * (now - task.areaAt)
    task.areaAt = now
    task.inFlight += delta
  }

  const startExecutor = (task: TaskState, ready: boolean) => {
    const executor: Executor = { task, state: "starting", busy: false, batch: [], busySince: 0 }
    task.executors.push(executor)
    task.live++
    held += task.spec.devicesPerExecutor
    if (ready) becomeActive(executor)
    else events.push({ t: now + task.spec.startupMs, seq: seq++, kind: "ready", executor })
  }

  const becomeActive = (executor: Executor) => {
    executor.state = "active"
    serve(executor)
  }

  const removeExecutor = (executor: Executor) => {
    const { task } = executor
    if (executor.state !== "draining") task.live--
    executor.state = "gone"
    task.executors.splice(task.executors.indexOf(executor), 1)
    const idleAt = task.idle.indexOf(executor)
    if (idleAt >= 0) task.idle.splice(idleAt, 1)
    held -= task.spec.devicesPerExecutor
    startPending()
  }

  /** Places the executors that wait for devices, in task order, while devices are free. */
  const startPending = () => {
    for (const task of tasks) {
      while (task.pending > 0 && scenario.devices - held >= task.spec.devicesPerExecutor) {
        task.pending--
        startExecutor(task, false)
      }
    }
  }

  /** The executor takes a batch from its task's queue, or waits idle. */
  const serve = (executor: Executor) => {
    const { task } = executor
    const waiting = task.queue.length - task.head
    if (executor.state === "draining") return removeExecutor(executor)
    if (waiting === 0) {
      task.idle.push(executor)
      return
    }
    const size = Math.min(waiting, task.spec.maxBatch)
    const batch = task.queue.slice(task.head, task.head + size)
    task.head += size
    if (task.head > 4096 && task.head * 2 > task.queue.length) {
      task.queue = task.queue.slice(task.head)
      task.head = 0
    }
    for (const request of batch) {
      const wait = now - request.enqueuedAt
      if (wait > request.worstWait) {
        request.worstWait = wait
        request.worstStage = task.index
      }
    }
    executor.busy = true
    executor.batch = batch
    executor.busySince = now
    task.busy++
    const shared = task.spec.effectiveExecutors
    const slowdown = shared === undefined ? 1 : Math.max(1, task.busy / shared)
    events.push({
      t: now + (task.spec.baseMs + task.spec.perItemMs * size) * slowdown,
      seq: seq++,
      kind: "done",
      executor
    })
  }

  const finish = (request: Request, good: boolean) => {
    if (good) phaseCounts[request.phase]!.good++
    else tasks[request.worstStage]!.lost++
  }

  /** The request enters its current stage's task, or is refused there. */
  const enter = (request: Request) => {
    const app = apps[request.app]!
    const task = tasks[app.stageIndex[request.stage]!]!
    task.arrived++
    const bound = scenario.queuePerExecutor * Math.max(1, task.live)
    if (task.queue.length - task.head >= bound) {
      phaseCounts[request.phase]!.refused++
      task.lost++
      return
    }
    countLoad(task, 1)
    request.enqueuedAt = now
    task.queue.push(request)
    const idle = task.idle.pop()
    if (idle !== undefined) serve(idle)
  }

  const round = (rules: RebalancePolicy) => {
    const roundMs = options.policy!.roundMs
    const reading = tasks.map((task, index): RebalanceTask => {
      countLoad(task, 0)
      const last = lastReading[index]!
      lastReading[index] = { area: task.area, arrived: task.arrived }
      const shared = task.spec.effectiveExecutors
      if (shared !== undefined && task.live > 0) task.ranAt.add(task.live)
      return {
        id: task.spec.id,
        executors: task.live + task.pending,
        devicesPerExecutor: task.spec.devicesPerExecutor,
        minExecutors: task.spec.minExecutors,
        maxExecutors: task.spec.maxExecutors,
        meanLoad: (task.area - last.area) / roundMs,
        rate: ((task.arrived - last.arrived) * 1000) / roundMs,
        capacity: task.capacity,
        // What the task sustained at each executor count it ran, as its live profile would show it.
        sustained:
          shared === undefined
            ? undefined
            : [...task.ranAt].map((count) => [count, task.capacity * Math.min(count, shared)] as const),
        changedAt: task.changedAt
      }
    })
    const state = {
      now,
      // A draining executor's devices are promised to the executors pending on them: what is free is
      // what no executor holds, will hold, or waits for.
      freeDevices:
        scenario.devices -
        tasks.reduce((sum, task) => sum + (task.live + task.pending) * task.spec.devicesPerExecutor, 0),
      tasks: reading
    }
    /** One executor of the task leaves: a placed one not started yet, an idle one at once, else one drains. */
    const shrink = (taskId: string) => {
      const donor = tasks[taskIndex.get(taskId)!]!
      donor.changedAt = now
      devicesMoved += donor.spec.devicesPerExecutor
      if (donor.pending > 0) {
        donor.pending--
        return
      }
      const victim =
        donor.idle[0] ??
        donor.executors.find((executor) => executor.state === "starting") ??
        donor.executors.find((executor) => executor.state === "active")!
      if (victim.state === "starting" || !victim.busy) removeExecutor(victim)
      else {
        victim.state = "draining"
        donor.live--
      }
    }
    const grow = (taskId: string) => {
      const task = tasks[taskIndex.get(taskId)!]!
      task.changedAt = now
      task.pending++
      startPending()
    }
    for (const move of planMoves(state, rules)) {
      moves++
      switch (move._tag) {
        case "Release":
          released++
          shrink(move.task)
          break
        case "Grow":
          devicesMoved += tasks[taskIndex.get(move.task)!]!.spec.devicesPerExecutor
          grow(move.task)
          break
        case "Take":
          for (const from of move.from) shrink(from)
          grow(move.to)
          break
      }
    }
  }
  const lastReading = tasks.map(() => ({ area: 0, arrived: 0 }))

  for (const task of tasks) for (let i = 0; i < (options.split[task.spec.id] ?? 0); i++) startExecutor(task, true)
  if (held > scenario.devices) throw new Error(`the split holds ${held} devices of ${scenario.devices}`)

  // Arrivals: one pending event per app, walking its merged arrival times over the phases.
  const arrivalTimes = apps.map(() => [] as Array<number>)
  const arrivalPhase = apps.map(() => [] as Array<number>)
  phaseIndices.forEach((phaseIndex, position) => {
    const arrivals = arrivalsOf(scenario, phaseIndex)
    apps.forEach((app, appIndex) => {
      for (const t of arrivals.get(app.id)!) {
        arrivalTimes[appIndex]!.push(starts[position]! + t)
        arrivalPhase[appIndex]!.push(position)
      }
    })
  })
  const nextArrival = apps.map(() => 0)
  const scheduleArrival = (app: number) => {
    const at = arrivalTimes[app]![nextArrival[app]!]
    if (at !== undefined) events.push({ t: at, seq: seq++, kind: "arrive", app })
  }
  apps.forEach((_, index) => scheduleArrival(index))
  if (options.policy !== undefined) events.push({ t: options.policy.roundMs, seq: seq++, kind: "round" })

  const maxTarget = Math.max(...apps.map((app) => app.targetMs))
  const stopAt = end + maxTarget
  // Executors per task sampled every second, summed per phase.
  const sampleMs = 1000
  const samples = phaseIndices.map(() => 0)
  const sample = () => {
    const position = starts.findLastIndex((start) => start <= now)
    samples[position]!++
    for (const task of tasks) splitArea[position]![task.index]! += task.live
  }
  events.push({ t: 0, seq: seq++, kind: "sample" })

  for (;;) {
    const event = events.pop()
    if (event === undefined || event.t > stopAt) break
    now = event.t
    handled++
    switch (event.kind) {
      case "arrive": {
        const position = arrivalPhase[event.app]![nextArrival[event.app]!]!
        nextArrival[event.app]!++
        scheduleArrival(event.app)
        phaseCounts[position]!.requests++
        enter({
          app: event.app,
          phase: position,
          arrivedAt: now,
          stage: 0,
          enqueuedAt: now,
          worstStage: 0,
          worstWait: -1
        })
        break
      }
      case "done": {
        const { executor } = event
        const { task } = executor
        executor.busy = false
        task.busy--
        task.busyMs += now - executor.busySince
        countLoad(task, -executor.batch.length)
        for (const request of executor.batch) {
          const app = apps[request.app]!
          if (now - request.arrivedAt > app.targetMs) finish(request, false)
          else if (request.stage + 1 === app.stages.length) finish(request, true)
          else {
            request.stage++
            enter(request)
          }
        }
        executor.batch = []
        serve(executor)
        break
      }
      case "sample":
        sample()
        if (now + sampleMs < end) events.push({ t: now + sampleMs, seq: seq++, kind: "sample" })
        break
      case "ready":
        if (event.executor.state === "starting") becomeActive(event.executor)
        break
      case "round":
        round(options.policy!.rules)
        if (now + options.policy!.roundMs < end)
          events.push({ t: now + options.policy!.roundMs, seq: seq++, kind: "round" })
        break
    }
  }
  // Executor time (ms) per task, from the samples.
  const executorTime = tasks.map((task) => splitArea.reduce((sum, area) => sum + area[task.index]! * sampleMs, 0))
  return {
    phases: phaseIndices.map((index, position) => {
      const counts = phaseCounts[position]!
      return {
        name: scenario.phases[index]!.name,
        ...counts,
        goodput: counts.requests === 0 ? 1 : counts.good / counts.requests
      }
    }),
    tasks: Object.fromEntries(
      tasks.map((task) => [
        task.spec.id,
        { lost: task.lost, utilization: executorTime[task.index]! > 0 ? task.busyMs / executorTime[task.index]! : 0 }
      ])
    ),
    moves,
    devicesMoved,
    released,
    meanSplit: phaseIndices.map((_index, position) =>
      Object.fromEntries(
        tasks.map((task) => [task.spec.id, splitArea[position]![task.index]! / Math.max(1, samples[position]!)])
      )
    ),
    events: handled
  }
}

// ---------------------------------------------------------------------------------------------
// Static splits

export const devicesOf = (scenario: Scenario, split: Split) =>
  scenario.tasks.reduce((sum, task) => sum + (split[task.id] ?? 0) * task.devicesPerExecutor, 0)

/** The devices split evenly: each task as many executors as its even share of devices holds. */
export const evenSplit = (scenario: Scenario): Split => {
  const share = scenario.devices / scenario.tasks.length
  return Object.fromEntries(
    scenario.tasks.map((task) => [
      task.id,
      Math.min(task.maxExecutors, Math.max(task.minExecutors, Math.floor(share / task.devicesPerExecutor)))
    ])
  )
}

/**
 * Each task sized for the phase's mean rate at one utilisation, the highest that fits the pool,
 * then the devices left given one executor at a time to the task that would run hottest.
 */
export const proportionalSplit = (scenario: Scenario, phase: LoadPhase): Split => {
  const rates = taskRates(scenario, phase)
  const sizedAt = (utilization: number) =>
    Object.fromEntries(
      scenario.tasks.map((task) => [
        task.id,
        Math.min(
          task.maxExecutors,
          Math.max(task.minExecutors, Math.ceil(rates.get(task.id)! / (capacityOfTask(task) * utilization)))
        )
      ])
    )
  let [low, high] = [0.05, 1]
  for (let i = 0; i < 40; i++) {
    const middle = (low + high) / 2
    if (devicesOf(scenario, sizedAt(middle)) <= scenario.devices) high = middle
    else low = middle
  }
  const split: Record<string, number> = { ...sizedAt(high) }
  for (;;) {
    const left = scenario.devices - devicesOf(scenario, split)
    const hottest = scenario.tasks
      .filter((task) => task.devicesPerExecutor <= left && split[task.id]! < task.maxExecutors)
      .sort(
        (a, b) =>
          rates.get(b.id)! / (capacityOfTask(b) * split[b.id]!) - rates.get(a.id)! / (capacityOfTask(a) * split[a.id]!)
      )[0]
    if (hottest === undefined) return split
    split[hottest.id]!++
  }
}

export interface StaticSearch {
  readonly split: Split
  readonly result: PhaseResult
  readonly evaluations: number
}

/**
 * The best static split of one phase this search finds: from each start (the proportional split,
 * and any given), it moves executors to the task that lost the most requests from the tasks that
 * were least busy, simulating the whole phase for every candidate and keeping a move only when
 * goodput rises; a move that does not help is tried again at half the size, down to one executor.
 */
export const searchStaticSplit = (
  scenario: Scenario,
  phaseIndex: number,
  options: { readonly starts?: ReadonlyArray<Split>; readonly evaluations: number }
): StaticSearch => {
  const phase = scenario.phases[phaseIndex]!
  const specs = new Map(scenario.tasks.map((task) => [task.id, task]))
  let evaluations = 0
  const evaluate = (split: Split) => {
    evaluations++
    return simulate(scenario, { phases: [phaseIndex], split })
  }
  const starts = [proportionalSplit(scenario, phase), ...(options.starts ?? [])]
  let best: { split: Split; run: SimResult } | undefined
  for (const start of starts) {
    const run = evaluate(start)
    if (best === undefined || run.phases[0]!.good > best.run.phases[0]!.good) best = { split: start, run }
  }
  let current = best!
  let step = Math.max(1, Math.round(scenario.devices / 50))
  const tried = new Set<string>()
  while (
    evaluations < options.evaluations &&
    step >= 1 &&
    current.run.phases[0]!.good < current.run.phases[0]!.requests
  ) {
    const losers = Object.entries(current.run.tasks)
      .filter(([id, task]) => task.lost > 0 && current.split[id]! < specs.get(id)!.maxExecutors)
      .sort(([, a], [, b]) => b.lost - a.lost)
    const receiver = losers.map(([id]) => id).find((id) => !tried.has(`${id}/${step}`))
    if (receiver === undefined) {
      step = Math.floor(step / 2)
      tried.clear()
      continue
    }
    const receiving = specs.get(receiver)!
    const devicesWanted = Math.max(receiving.devicesPerExecutor, step)
    const candidate: Record<string, number> = { ...current.split }
    let pool = scenario.devices - devicesOf(scenario, candidate)
    const donors = Object.entries(current.run.tasks)
      .filter(([id]) => id !== receiver)
      .sort(([, a], [, b]) => a.utilization - b.utilization)
    for (const [id] of donors) {
      const donor = specs.get(id)!
      while (pool < devicesWanted && candidate[id]! > donor.minExecutors && current.run.tasks[id]!.lost === 0) {
        candidate[id]!--
        pool += donor.devicesPerExecutor
      }
      if (pool >= devicesWanted) break
    }
    const added = Math.min(
      Math.floor(pool / receiving.devicesPerExecutor),
      receiving.maxExecutors - candidate[receiver]!
    )
    if (added < 1) {
      tried.add(`${receiver}/${step}`)
      continue
    }
    candidate[receiver]! += added
    const run = evaluate(candidate)
    if (run.phases[0]!.good > current.run.phases[0]!.good) {
      current = { split: candidate, run }
      tried.clear()
    } else tried.add(`${receiver}/${step}`)
  }
  return { split: current.split, result: current.run.phases[0]!, evaluations }
}
