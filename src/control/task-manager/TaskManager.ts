import type * as Scope from "effect/Scope"
import type { UnitTaskSpec } from "../../app-runtime/driver/protocol.js"
import { Wakeup } from "../../executors/common/Wakeup.js"
import { TaskUnavailable } from "../errors.js"
import type { Executor, ExecutorKind } from "./ExecutorKinds.js"
import { ExecutorWedgedAfter } from "./HealthWatch.js"
import { IdleRelease, type IdleControl, type IdleStats, untilStarted } from "./IdleRelease.js"
import type { RecordedProfile } from "./ProfileRecording.js"
import { type ProfileSummary, TaskProfile } from "./TaskProfile.js"

/** "releasing", "released", "starting": its executors stop when idle and start again on the next call (IdleRelease.ts). */
export type TaskState = "deploying" | "ready" | "releasing" | "released" | "starting" | "tearing-down"

/**
 * How long a call waits for an executor to come back when none is in rotation: beyond the wedged
 * bound, time for one that exited to start again on a busy host.
 */
const executorWaitMs = ExecutorWedgedAfter.defaultValue() + 30_000

export interface ManagedExecutor {
  readonly id: string
  readonly node: string
  readonly executor: Executor
  readonly scope: Scope.CloseableScope
  /** Aborted when its node is lost: the calls in flight to it end at once. */
  readonly gone: AbortController
  outstanding: number
  healthy: boolean
  draining: boolean
  /** Resolves waiters once the executor has no request in flight. */
  idle: Array<() => void>
}

export interface ExecutorSummary {
  readonly id: string
  readonly node: string
  readonly url: string | null
  readonly devices: ReadonlyArray<string>
  readonly healthy: boolean
  readonly outstanding: number
}

/** One deployed unit task: its executors, the devices they hold, and how requests reach them. */
export interface TaskManager {
  readonly spec: UnitTaskSpec
  readonly state: TaskState
  /** How many executors it should have: fewer while some are being replaced. */
  readonly wanted: number
  executors(): ReadonlyArray<ExecutorSummary>
  /**
   * The healthy executor with the least outstanding work (waiting a bounded time for one), counted
   * as busy until the lease is released; `exclude` names one to avoid, for a retry. Fails with
   * TaskUnavailable when none comes back in time. A `synthetic` call (the platform's own, recording a
   * profile) holds its executor and counts towards the task's bound like any other, but not in what
   * the task's own calls show: its profile, its load, its calls shed.
   */
  lease(options: {
    readonly exclude?: string | undefined
    readonly signal?: AbortSignal
    readonly synthetic?: boolean
  }): Promise<ExecutorLease>
  /** What its calls have shown so far: latency by load level per executor count, rate, queue depth. */
  profile(): ProfileSummary
  /**
   * Its profile recorded ahead of time (`tasks profile ID --record`), read from the state dir when
   * it was deployed or kept when a recording ended; undefined when none was recorded.
   */
  recorded(): ProfileSummary | undefined
  /** Calls in flight integrated over time since deployment (calls × ms): its mean load between two readings. */
  loadArea(): number
  /** Calls refused since deployment because the task was full (see TaskQueueBound). */
  readonly shed: number
  /** Calls that asked for an executor since deployment, those refused included (not synthetic ones). */
  readonly arrived: number
  /** Its releases when idle and cold starts since deployment. */
  idleStats(): IdleStats
  /** Its executors started again if they were released (an explicit scale); resolves once they run. */
  wake(): Promise<void>
}

/** One request's hold on an executor. */
export interface ExecutorLease {
  readonly executorId: string
  readonly url: string
  /** The node it runs on: where the data it consumes must be sent. */
  readonly node: string
  /** Aborted when the executor's node is lost. */
  readonly signal: AbortSignal
  /** The task's calls in flight when it was granted, this one and synthetic ones included: the load it met. */
  readonly level: number
  /**
   * "unavailable": the executor could not take it, so it leaves rotation until its health check
   * passes; "unused": no call was made (the graph failed first), so the profile does not count it.
   */
  release(outcome: "ok" | "unavailable" | "failed" | "unused"): void
}

/**
 * The manager of one deployed unit task: its executors in rotation, the lease of the least busy
 * healthy one to each call (waiting a bounded time when none is), the task's bound on calls in
 * flight, its load and its profile, and its releases when idle (IdleRelease.ts). The task managers
 * (TaskManagers.ts) start and stop its executors.
 */
export class ManagedTask implements TaskManager {
  state: TaskState = "deploying"
  wanted = 0
  readonly profileOf = new TaskProfile(Date.now())
  /** Its profile recorded ahead of time, if one was. */
  recordedProfile: RecordedProfile | undefined
  private area = 0
  private inFlight = 0
  /** The synthetic calls among those in flight: they are left out of the load area. */
  private syntheticInFlight = 0
  private areaAt = performance.now()
  readonly members: Array<ManagedExecutor> = []
  private nextExecutor = 0
  /** Raised whenever an executor may have become free: one joined or is healthy again, a lease ended, the task is going. */
  private readonly mayBeFree = new Wakeup()
  /** Calls refused because the task was full. */
  shed = 0
  /** Calls that asked for an executor, refused ones included. */
  arrived = 0
  readonly idle: IdleRelease

  constructor(
    readonly spec: UnitTaskSpec,
    readonly kind: ExecutorKind,
    readonly scope: Scope.CloseableScope,
    private readonly queueBound: number,
    idle: { readonly afterS: number; readonly control: () => IdleControl | undefined }
  ) {
    this.idle = new IdleRelease(spec.id, idle.afterS, idle.control, (phase) => {
      if (this.state !== "tearing-down") this.state = phase === "running" ? "ready" : phase
    })
  }

  /** The task is going: calls waiting for an executor fail at once. */
  tearDown() {
    this.state = "tearing-down"
    this.idle.stop()
    this.mayBeFree.wakeAll()
  }

  idleStats(): IdleStats {
    return this.idle.stats()
  }

  wake(): Promise<void> {
    return this.idle.wake()
  }

  profile(): ProfileSummary {
    return this.profileOf.summary(Date.now())
  }

  recorded(): ProfileSummary | undefined {
    return this.recordedProfile
  }

  loadArea(): number {
    this.countLoad(0, false)
    return this.area
  }

  /**
   * Adds the load of the task's own calls since the last change to the area, then changes the calls
   * in flight by `delta`.
   */
  private countLoad(delta: number, synthetic: boolean) {
    const now = performance.now()
    this.area += (this.inFlight - this.syntheticInFlight) * (now - this.areaAt)
    this.areaAt = now
    this.inFlight += delta
    if (synthetic) this.syntheticInFlight += delta
  }

  /** A fresh executor id of this task. */
  newExecutorId(): string {
    return `${this.spec.id}-${this.nextExecutor++}`
  }

  executors(): ReadonlyArray<ExecutorSummary> {
    return this.members.map((member) => ({
      id: member.id,
      node: member.node,
      url: member.executor.url() ?? null,
      devices: member.executor.devices.map((device) => device.id),
      healthy: member.healthy && !member.draining,
      outstanding: member.outstanding
    }))
  }

  add(id: string, node: string, executor: Executor, scope: Scope.CloseableScope): ManagedExecutor {
    const member: ManagedExecutor = {
      id,
      node,
      executor,
      scope,
      gone: new AbortController(),
      outstanding: 0,
      healthy: true,
      draining: false,
      idle: []
    }
    this.members.push(member)
    this.mayBeFree.wakeAll()
    return member
  }

  setHealth(member: ManagedExecutor, healthy: boolean) {
    member.healthy = healthy
    if (healthy) this.mayBeFree.wakeAll()
  }

  private pick(exclude: ManagedExecutor | undefined): ManagedExecutor | undefined {
    const candidates = this.members.filter(
      (member) => member.healthy && !member.draining && member.executor.url() !== undefined
    )
    const preferred = candidates.filter((member) => member !== exclude)
    const pool = preferred.length > 0 ? preferred : candidates
    return pool.reduce<ManagedExecutor | undefined>(
      (best, member) => (best === undefined || member.outstanding < best.outstanding ? member : best),
      undefined
    )
  }

  /**
   * A healthy executor, waiting a bounded time for one to come back if none is: each time one may
   * have (see `mayBeFree`), until the deadline or the caller's signal.
   */
  private async choose(
    exclude: ManagedExecutor | undefined,
    signal: AbortSignal | undefined
  ): Promise<ManagedExecutor> {
    const deadline = Date.now() + executorWaitMs
    for (;;) {
      const member = this.pick(exclude)
      if (member !== undefined) return member
      if (this.state === "tearing-down")
        throw new TaskUnavailable({ message: `task ${this.spec.id} is being torn down` })
      const left = deadline - Date.now()
      if (left <= 0 || signal?.aborted)
        throw new TaskUnavailable({ message: `task ${this.spec.id} has no healthy executor` })
      await this.mayBeFree.wait(left, signal)
    }
  }

  /** A lease, the task's executors started first when they were released (see IdleRelease). */
  async lease(options: {
    readonly exclude?: string | undefined
    readonly signal?: AbortSignal
    readonly synthetic?: boolean
  }): Promise<ExecutorLease> {
    const coldStart = this.idle.enter()
    try {
      if (coldStart !== undefined) await untilStarted(this.spec.id, coldStart, options.signal)
      const lease = await this.leaseRunning(options)
      let left = false
      return {
        ...lease,
        release: (outcome) => {
          lease.release(outcome)
          if (left) return
          left = true
          this.idle.leave()
        }
      }
    } catch (error) {
      this.idle.leave()
      throw error
    }
  }

  private async leaseRunning(options: {
    readonly exclude?: string | undefined
    readonly signal?: AbortSignal
    readonly synthetic?: boolean
  }): Promise<ExecutorLease> {
    const synthetic = options.synthetic === true
    if (!synthetic) this.arrived++
    const inRotation = this.members.filter((member) => member.healthy && !member.draining).length
    const limit = this.queueBound * Math.max(1, inRotation)
    if (this.inFlight >= limit) {
      if (!synthetic) this.shed++
      throw new TaskUnavailable({
        message: `task ${this.spec.id} is full: ${this.inFlight} calls in flight, its limit with ${inRotation} executor(s) in rotation is ${limit}`
      })
    }
    const member = await this.choose(
      this.members.find((candidate) => candidate.id === options.exclude),
      options.signal
    )
    member.outstanding++
    this.countLoad(1, synthetic)
    const level = this.inFlight
    const executors = this.members.length
    const started = performance.now()
    let released = false
    return {
      executorId: member.id,
      url: member.executor.url()!,
      node: member.node,
      signal: member.gone.signal,
      level,
      release: (outcome) => {
        if (released) return
        released = true
        this.countLoad(-1, synthetic)
        if (outcome !== "unused" && !synthetic)
          this.profileOf.record({
            endedAt: Date.now(),
            latencyMs: performance.now() - started,
            level,
            executors,
            ok: outcome === "ok"
          })
        if (outcome === "unavailable") this.setHealth(member, false)
        member.outstanding--
        if (member.outstanding === 0) for (const wake of member.idle.splice(0)) wake()
        this.mayBeFree.wakeAll()
      }
    }
  }

  /** Takes an executor out of rotation and resolves once its requests in flight are done. */
  drain(member: ManagedExecutor): Promise<void> {
    member.draining = true
    if (member.outstanding === 0) return Promise.resolve()
    return new Promise((resolve) => member.idle.push(resolve))
  }
}
