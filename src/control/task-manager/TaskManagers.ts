import * as Http from "node:http"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as ExecutionStrategy from "effect/ExecutionStrategy"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import * as Scope from "effect/Scope"
import type { UnitTaskSpec } from "../../app-runtime/driver/protocol.js"
import type { Executor, ExecutorKind } from "./ExecutorKinds.js"
import { IdleRelease, type IdleControl, type IdleStats, idleReleaseAfterS, untilStarted } from "./IdleRelease.js"
import type { NodeHandle } from "../cluster/NodeHandle.js"
import { type HealthReport, healthWatchPeriodMs } from "../../executors/common/Health.js"
import { Wakeup } from "../../executors/common/Wakeup.js"
import type { Device } from "../../node/Devices.js"
import { TaskUnavailable } from "../errors.js"
import { ServeConfig } from "../../config/ServeConfig.js"
import type { RecordedProfile } from "./ProfileRecording.js"
import { makeProfileStore } from "./ProfileStore.js"
import { type ProfileSummary, TaskProfile } from "./TaskProfile.js"

/** "releasing", "released", "starting": its executors stop when idle and start again on the next call (IdleRelease.ts). */
export type TaskState = "deploying" | "ready" | "releasing" | "released" | "starting" | "tearing-down"

/**
 * How many calls each task takes at the dispatcher, per executor in rotation, before it refuses the
 * next (503, Retry-After): a request refused here is refused before any of its work starts, rather
 * than waiting behind hundreds of others in an executor's queue. `serve --task-queue` sets it.
 */
export class TaskQueueBound extends Context.Reference<TaskQueueBound>()("cornserve/TaskQueueBound", {
  defaultValue: () => 64
}) {}

/**
 * How long an executor's health watch may stay silent before the executor counts as wedged. Its
 * process exiting ends the stream, and an executor that finds itself unhealthy says so, both at
 * once; silence alone means only that its router's event loop is not running, which on a busy
 * host (or a stopped process) lasts seconds and ends by itself. The executor stays in rotation
 * meanwhile: its requests wait for it rather than being refused.
 */
export class ExecutorWedgedAfter extends Context.Reference<ExecutorWedgedAfter>()("cornserve/ExecutorWedgedAfter", {
  defaultValue: () => 30_000
}) {}

/**
 * How long a call waits for an executor to come back when none is in rotation: beyond the wedged
 * bound, time for one that exited to start again on a busy host.
 */
const executorWaitMs = ExecutorWedgedAfter.defaultValue() + 30_000

interface ManagedExecutor {
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

/** Where one executor goes: a node and its devices there, and the threads it may use on each (default 1). */
export interface ExecutorGroup {
  readonly node: NodeHandle
  readonly devices: ReadonlyArray<Device>
  readonly threads?: number
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

class ManagedTask implements TaskManager {
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

/**
 * Follows one executor's `/health/watch` stream until it ends: each line sets the executor's health;
 * the stream ending (the executor gone or restarting) takes it out of rotation until a new watch
 * sees it ready. A slow executor (lines late, its event loop starved) stays in rotation; one silent
 * for `wedgedAfterMs` (see ExecutorWedgedAfter) is wedged and restarted, as is one that reports
 * itself unhealthy.
 */
const watchHealth = (member: ManagedExecutor, task: ManagedTask, secret: string | undefined, wedgedAfterMs: number) =>
  Effect.async<void>((resume) => {
    const url = member.executor.url()
    if (url === undefined) {
      task.setHealth(member, false)
      resume(Effect.void)
      return
    }
    let silence: NodeJS.Timeout | undefined
    const listen = () => {
      clearTimeout(silence)
      silence = setTimeout(() => {
        task.setHealth(member, false)
        member.executor.restart(`its health watch was silent for ${wedgedAfterMs / 1000} s`)
      }, wedgedAfterMs)
    }
    let ended = false
    const end = () => {
      if (ended) return
      ended = true
      clearTimeout(silence)
      task.setHealth(member, false)
      request.destroy()
      resume(Effect.void)
    }
    const headers = secret === undefined ? {} : { authorization: `Bearer ${secret}` }
    const request = Http.get(`${url}/health/watch`, { agent: false, headers }, (response) => {
      if (response.statusCode !== 200) return end()
      response.setEncoding("utf8")
      let pending = ""
      response.on("data", (text: string) => {
        pending += text
        for (let newline = pending.indexOf("\n"); newline >= 0; newline = pending.indexOf("\n")) {
          const line = pending.slice(0, newline)
          pending = pending.slice(newline + 1)
          let report: Partial<HealthReport> & { readonly reason?: string }
          try {
            report = JSON.parse(line) as typeof report
          } catch {
            continue
          }
          listen()
          task.setHealth(member, report.status === "ready")
          if (report.status === "ready" && typeof report.inFlight === "number")
            task.profileOf.observeQueue(report.inFlight, Date.now())
          if (report.status === "unhealthy") member.executor.restart(report.reason ?? "it reported itself unhealthy")
        }
      })
      response.once("end", end)
      response.once("error", end)
    })
    request.once("error", end)
    request.once("close", end)
    // Silence counts from the request: an executor that takes the connection but never answers is wedged too.
    listen()
    return Effect.sync(() => {
      ended = true
      clearTimeout(silence)
      request.destroy()
    })
  })

/** The task managers of every deployed unit task, by task id. */
export class TaskManagers extends Effect.Service<TaskManagers>()("cornserve/TaskManagers", {
  scoped: Effect.gen(function* () {
    const queueBound = yield* TaskQueueBound
    const wedgedAfterMs = yield* ExecutorWedgedAfter
    // Recorded profiles are kept in the state dir; task managers without one (in a test) keep none.
    const config = yield* Effect.serviceOption(ServeConfig)
    const profiles = Option.map(config, (served) => makeProfileStore(served.stateDir))
    // The internal secret executors take calls with, their health watch included.
    const secret = Option.getOrUndefined(Option.map(config, (served) => served.internalSecret))
    const idleDefaultS = Option.match(config, { onNone: () => 0, onSome: (served) => served.idleReleaseS ?? 0 })
    /** Who stops and starts idle tasks' executors: the resource manager, once it is up. */
    let idleControl: IdleControl | undefined
    const tasks = new Map<string, ManagedTask>()

    const teardown = (taskId: string) =>
      Effect.suspend(() => {
        const task = tasks.get(taskId)
        if (task === undefined) return Effect.void
        task.tearDown()
        return Scope.close(task.scope, Exit.void).pipe(Effect.ensuring(Effect.sync(() => tasks.delete(taskId))))
      })

    // All at once: a stop waits for the slowest executor, not for the sum of them.
    yield* Effect.addFinalizer(() =>
      Effect.forEach([...tasks.keys()], teardown, { concurrency: "unbounded", discard: true })
    )

    const startExecutor = (task: ManagedTask, group: ExecutorGroup) =>
      Effect.gen(function* () {
        const scope = yield* Scope.fork(task.scope, ExecutionStrategy.sequential)
        const id = task.newExecutorId()
        const executor = yield* Scope.extend(
          task.kind.start(task.spec, { node: group.node, devices: group.devices, threads: group.threads ?? 1, id }),
          scope
        ).pipe(Effect.onError(() => Scope.close(scope, Exit.void)))
        const member = task.add(id, group.node.name, executor, scope)
        yield* watchHealth(member, task, secret, wedgedAfterMs).pipe(
          Effect.zipRight(Effect.sleep(healthWatchPeriodMs)),
          Effect.forever,
          Effect.forkIn(scope)
        )
        return member
      })

    /** A task's manager, with its recorded profile, before any executor starts. */
    const newTask = (spec: UnitTaskSpec, kind: ExecutorKind) =>
      Effect.gen(function* () {
        const task = new ManagedTask(spec, kind, yield* Scope.make(), queueBound, {
          afterS: idleReleaseAfterS(spec.config, idleDefaultS),
          control: () => idleControl
        })
        if (Option.isSome(profiles)) task.recordedProfile = yield* profiles.value.load(spec.id)
        return task
      })

    /** Starts the task's executors, one per group, and waits until each is up. */
    const deploy = (spec: UnitTaskSpec, kind: ExecutorKind, groups: ReadonlyArray<ExecutorGroup>) =>
      Effect.gen(function* () {
        const task = yield* newTask(spec, kind)
        task.wanted = groups.length
        tasks.set(spec.id, task)
        yield* Effect.forEach(groups, (group) => startExecutor(task, group), {
          concurrency: "unbounded"
        }).pipe(Effect.onError(() => teardown(spec.id)))
        task.state = "ready"
        task.idle.started()
        return task as TaskManager
      })

    /** The task deployed released: no executor until its first call starts them (IdleRelease.ts). */
    const deployReleased = (spec: UnitTaskSpec, kind: ExecutorKind) =>
      Effect.gen(function* () {
        const task = yield* newTask(spec, kind)
        tasks.set(spec.id, task)
        task.idle.deployedReleased()
        return task as TaskManager
      })

    /**
     * More executors. `replacing`: they stand in for executors the task lost (its wanted count
     * stays); otherwise the task grows.
     */
    const grow = (taskId: string, groups: ReadonlyArray<ExecutorGroup>, replacing = false) =>
      Effect.gen(function* () {
        const task = tasks.get(taskId)!
        if (!replacing) task.wanted += groups.length
        yield* Effect.forEach(groups, (group) => startExecutor(task, group), {
          concurrency: "unbounded",
          discard: true
        }).pipe(
          Effect.onError(() =>
            Effect.sync(() => {
              if (!replacing) task.wanted -= groups.length
            })
          )
        )
      })

    /**
     * Fewer executors: each leaves rotation, finishes its requests, then stops. `executors` is how
     * many (the latest started), or which, by id. Answers where they ran.
     */
    const shrink = (taskId: string, executors: number | ReadonlyArray<string>) =>
      Effect.gen(function* () {
        const task = tasks.get(taskId)!
        const leaving =
          typeof executors === "number"
            ? task.members.slice(-executors)
            : task.members.filter((member) => executors.includes(member.id))
        task.wanted -= leaving.length
        yield* Effect.forEach(
          leaving,
          (member) =>
            Effect.promise(() => task.drain(member)).pipe(
              Effect.zipRight(Scope.close(member.scope, Exit.void)),
              Effect.ensuring(Effect.sync(() => task.members.splice(task.members.indexOf(member), 1)))
            ),
          { concurrency: "unbounded", discard: true }
        )
        return leaving.map((member) => ({ node: member.node, devices: member.executor.devices }))
      })

    /**
     * Every executor on `node` leaves its task at once (the node is lost, or its process started
     * again): calls in flight to them are aborted, and stopping them is left to run in the
     * background (a lost node may not answer). Answers, per task, the devices they held.
     */
    const dropNode = (node: string) =>
      Effect.gen(function* () {
        const dropped: Array<{ readonly taskId: string; readonly devices: ReadonlyArray<Device> }> = []
        for (const task of tasks.values()) {
          const gone = task.members.filter((member) => member.node === node)
          for (const member of gone) {
            task.members.splice(task.members.indexOf(member), 1)
            member.healthy = false
            member.gone.abort()
            dropped.push({ taskId: task.spec.id, devices: member.executor.devices })
            yield* Effect.forkDaemon(Scope.close(member.scope, Exit.void))
          }
        }
        return dropped
      })

    /**
     * A recording of the task's profile ended: it is the task's recorded profile from now on, and is
     * kept in the state dir (failing when it could not be written there).
     */
    const keepRecorded = (taskId: string, profile: RecordedProfile) =>
      Effect.suspend(() => {
        const task = tasks.get(taskId)
        if (task !== undefined) task.recordedProfile = profile
        return Option.isSome(profiles) ? profiles.value.save(taskId, profile) : Effect.void
      })

    return {
      deploy,
      deployReleased,
      teardown,
      /** Who stops idle tasks' executors and starts them again (the resource manager, which holds the devices). */
      controlIdle: (control: IdleControl) => {
        idleControl = control
      },
      grow,
      shrink,
      dropNode,
      keepRecorded,
      /** The task's recorded profile, with when and how it was recorded. */
      recordedProfile: (taskId: string): RecordedProfile | undefined => tasks.get(taskId)?.recordedProfile,
      get: (taskId: string): TaskManager | undefined => tasks.get(taskId),
      list: (): ReadonlyArray<TaskManager> => [...tasks.values()]
    }
  })
}) {}
