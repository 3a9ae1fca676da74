import * as Http from "node:http"
import { Effect, ExecutionStrategy, Exit, Scope } from "effect"
import type { UnitTaskSpec } from "../../app-runtime/driver/protocol.js"
import type { Executor, ExecutorKind } from "../../executors/ExecutorKinds.js"
import { type HealthReport, healthWatchPeriodMs } from "../../executors/common/Health.js"
import type { Device } from "../../node/Devices.js"
import { TaskUnavailable } from "../errors.js"

export type TaskState = "deploying" | "ready" | "tearing-down"

/** How long an executor's health watch may stay silent: an unhealthy executor leaves rotation within a second. */
const healthTimeoutMs = 750

interface ManagedExecutor {
  readonly id: string
  readonly executor: Executor
  readonly scope: Scope.CloseableScope
  outstanding: number
  healthy: boolean
  draining: boolean
  /** Resolves waiters once the executor has no request in flight. */
  idle: Array<() => void>
}

export interface ExecutorSummary {
  readonly id: string
  readonly url: string | null
  readonly devices: ReadonlyArray<string>
  readonly healthy: boolean
  readonly outstanding: number
}

/** One deployed unit task: its executors, the devices they hold, and how requests reach them. */
export interface TaskManager {
  readonly spec: UnitTaskSpec
  readonly state: TaskState
  readonly devices: ReadonlyArray<Device>
  executors(): ReadonlyArray<ExecutorSummary>
  /**
   * The healthy executor with the least outstanding work (waiting a bounded time for one), counted
   * as busy until the lease is released; `exclude` names one to avoid, for a retry. Fails with
   * TaskUnavailable when none comes back in time.
   */
  lease(options: { readonly exclude?: string; readonly signal?: AbortSignal }): Promise<ExecutorLease>
}

/** One request's hold on an executor. */
export interface ExecutorLease {
  readonly executorId: string
  readonly url: string
  /** "unavailable": the executor could not take it, so it leaves rotation until its health check passes. */
  release(outcome: "ok" | "unavailable" | "failed"): void
}

class ManagedTask implements TaskManager {
  state: TaskState = "deploying"
  devices: Array<Device>
  readonly members: Array<ManagedExecutor> = []
  private nextExecutor = 0
  private readonly waiters: Array<() => void> = []

  constructor(
    readonly spec: UnitTaskSpec,
    readonly kind: ExecutorKind,
    readonly scope: Scope.CloseableScope,
    devices: ReadonlyArray<Device>
  ) {
    this.devices = [...devices]
  }

  executors(): ReadonlyArray<ExecutorSummary> {
    return this.members.map((member) => ({
      id: member.id,
      url: member.executor.url() ?? null,
      devices: member.executor.devices.map((device) => device.id),
      healthy: member.healthy && !member.draining,
      outstanding: member.outstanding
    }))
  }

  add(executor: Executor, scope: Scope.CloseableScope): ManagedExecutor {
    const member: ManagedExecutor = {
      id: `${this.spec.id}-${this.nextExecutor++}`,
      executor,
      scope,
      outstanding: 0,
      healthy: true,
      draining: false,
      idle: []
    }
    this.members.push(member)
    this.wake()
    return member
  }

  setHealth(member: ManagedExecutor, healthy: boolean) {
    member.healthy = healthy
    if (healthy) this.wake()
  }

  private wake() {
    for (const waiter of this.waiters.splice(0)) waiter()
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

  /** A healthy executor, waiting a bounded time for one to come back if none is. */
  private async choose(
    exclude: ManagedExecutor | undefined,
    signal: AbortSignal | undefined
  ): Promise<ManagedExecutor> {
    const deadline = Date.now() + 15_000
    for (;;) {
      const member = this.pick(exclude)
      if (member !== undefined) return member
      if (this.state === "tearing-down")
        throw new TaskUnavailable({ message: `task ${this.spec.id} is being torn down` })
      if (Date.now() > deadline || signal?.aborted)
        throw new TaskUnavailable({ message: `task ${this.spec.id} has no healthy executor` })
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 100)
        this.waiters.push(() => {
          clearTimeout(timer)
          resolve()
        })
      })
    }
  }

  async lease(options: { readonly exclude?: string; readonly signal?: AbortSignal }): Promise<ExecutorLease> {
    const member = await this.choose(
      this.members.find((candidate) => candidate.id === options.exclude),
      options.signal
    )
    member.outstanding++
    let released = false
    return {
      executorId: member.id,
      url: member.executor.url()!,
      release: (outcome) => {
        if (released) return
        released = true
        if (outcome === "unavailable") member.healthy = false
        member.outstanding--
        if (member.outstanding === 0) for (const wake of member.idle.splice(0)) wake()
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
 * silence for longer than `healthTimeoutMs` (a stuck executor) takes it out of rotation until a line
 * comes again; the stream ending (the executor gone or restarting) takes it out until a new watch
 * sees it ready. An executor that reports itself unhealthy is restarted.
 */
const watchHealth = (member: ManagedExecutor, task: ManagedTask) =>
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
      silence = setTimeout(() => task.setHealth(member, false), healthTimeoutMs)
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
    const request = Http.get(`${url}/health/watch`, { agent: false }, (response) => {
      if (response.statusCode !== 200) return end()
      response.setEncoding("utf8")
      let pending = ""
      listen()
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
          if (report.status === "unhealthy") member.executor.restart(report.reason ?? "it reported itself unhealthy")
        }
      })
      response.once("end", end)
      response.once("error", end)
    })
    request.once("error", end)
    request.once("close", end)
    return Effect.sync(() => {
      ended = true
      clearTimeout(silence)
      request.destroy()
    })
  })

/** The task managers of every deployed unit task, by task id. */
export class TaskManagers extends Effect.Service<TaskManagers>()("cornserve/TaskManagers", {
  scoped: Effect.gen(function* () {
    const tasks = new Map<string, ManagedTask>()

    const teardown = (taskId: string) =>
      Effect.suspend(() => {
        const task = tasks.get(taskId)
        if (task === undefined) return Effect.void
        task.state = "tearing-down"
        return Scope.close(task.scope, Exit.void).pipe(Effect.ensuring(Effect.sync(() => tasks.delete(taskId))))
      })

    yield* Effect.addFinalizer(() => Effect.forEach([...tasks.keys()], teardown, { discard: true }))

    const startExecutor = (task: ManagedTask, devices: ReadonlyArray<Device>) =>
      Effect.gen(function* () {
        const scope = yield* Scope.fork(task.scope, ExecutionStrategy.sequential)
        const executor = yield* Scope.extend(task.kind.start(task.spec, devices), scope).pipe(
          Effect.onError(() => Scope.close(scope, Exit.void))
        )
        const member = task.add(executor, scope)
        yield* watchHealth(member, task).pipe(
          Effect.zipRight(Effect.sleep(healthWatchPeriodMs)),
          Effect.forever,
          Effect.forkIn(scope)
        )
        return member
      })

    const groupsOf = (task: ManagedTask, devices: ReadonlyArray<Device>) => {
      const perExecutor = Math.max(1, task.kind.devicesPerExecutor(task.spec))
      return Array.from({ length: Math.floor(devices.length / perExecutor) }, (_, index) =>
        devices.slice(index * perExecutor, (index + 1) * perExecutor)
      )
    }

    /** Starts the task's executors on `devices` and waits until each is up. */
    const deploy = (spec: UnitTaskSpec, kind: ExecutorKind, devices: ReadonlyArray<Device>) =>
      Effect.gen(function* () {
        const task = new ManagedTask(spec, kind, yield* Scope.make(), devices)
        tasks.set(spec.id, task)
        yield* Effect.forEach(groupsOf(task, devices), (group) => startExecutor(task, group), {
          concurrency: "unbounded"
        }).pipe(Effect.onError(() => teardown(spec.id)))
        task.state = "ready"
        return task as TaskManager
      })

    /** More executors on more devices. */
    const grow = (taskId: string, devices: ReadonlyArray<Device>) =>
      Effect.gen(function* () {
        const task = tasks.get(taskId)!
        yield* Effect.forEach(groupsOf(task, devices), (group) => startExecutor(task, group), {
          concurrency: "unbounded"
        })
        task.devices.push(...devices)
      })

    /** Fewer executors: each leaves rotation, finishes its requests, then stops. Answers the devices freed. */
    const shrink = (taskId: string, executors: number) =>
      Effect.gen(function* () {
        const task = tasks.get(taskId)!
        const leaving = task.members.slice(-executors)
        yield* Effect.forEach(
          leaving,
          (member) =>
            Effect.promise(() => task.drain(member)).pipe(
              Effect.zipRight(Scope.close(member.scope, Exit.void)),
              Effect.ensuring(Effect.sync(() => task.members.splice(task.members.indexOf(member), 1)))
            ),
          { concurrency: "unbounded", discard: true }
        )
        const freed = leaving.flatMap((member) => member.executor.devices)
        task.devices = task.devices.filter((device) => !freed.includes(device))
        return freed
      })

    return {
      deploy,
      teardown,
      grow,
      shrink,
      get: (taskId: string): TaskManager | undefined => tasks.get(taskId),
      list: (): ReadonlyArray<TaskManager> => [...tasks.values()]
    }
  })
}) {}
