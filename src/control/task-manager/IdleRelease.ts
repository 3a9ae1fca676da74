import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import { TaskUnavailable } from "../errors.js"

/**
 * Where a task stands with scale to zero: running its executors; releasing them (it was idle);
 * released (none, its devices given back); or starting them again for a call (a cold start).
 */
export type IdlePhase = "running" | "releasing" | "released" | "starting"

/** How the task's executors are stopped and started again: the resource manager's side, which holds the devices. */
export interface IdleControl {
  /**
   * Stops every executor of the task and gives back their devices; answers false when it left
   * them (a call came for them meanwhile, or the task is going).
   */
  readonly release: (taskId: string) => Promise<boolean>
  /** Places and starts the task's executors again; fails with why they could not start. */
  readonly start: (taskId: string) => Promise<void>
}

/** A cold start's duration, in seconds: from a few hundred milliseconds (a tiny model) to minutes (a large one). */
export const coldStartBuckets = [0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300]

/** What a task's releases and cold starts have been since it was deployed. */
export interface IdleStats {
  /** Seconds without a call after which its executors stop; 0: they are kept. */
  readonly releaseAfterS: number
  readonly releases: number
  /** Cold starts that brought its executors back, with their durations per bucket of `coldStartBuckets`. */
  readonly coldStarts: { readonly buckets: ReadonlyArray<number>; readonly sum: number; readonly count: number }
  readonly coldStartsFailed: number
  /** The last cold start's duration in seconds; null: none yet. */
  readonly lastColdStartS: number | null
}

/**
 * The task's own idle time, as its config gives it (each unit task's config schema checked it at
 * registration): `idleReleaseS`, absent when the task leaves it to `serve --idle-release`.
 */
const IdleSetting = Schema.Struct({ idleReleaseS: Schema.optional(Schema.Number) })

/** Seconds a task's executors may stay without a call before they stop: its config's, else the serve default. */
export const idleReleaseAfterS = (config: unknown, serveDefaultS: number): number =>
  Option.match(Schema.decodeUnknownOption(IdleSetting)(config), {
    onNone: () => serveDefaultS,
    onSome: (setting) => setting.idleReleaseS ?? serveDefaultS
  })

/**
 * One task's scale to zero: counts the calls that want its executors (from asking for one to
 * giving it back, waiting included), and once none has for `releaseAfterS` seconds, has its
 * executors released. The next call starts them again and waits; calls that arrive meanwhile wait
 * for the same start. A start that fails fails the calls waiting for it, and the next call tries
 * again. `releaseAfterS` 0 keeps the executors.
 */
export class IdleRelease {
  private phaseNow: IdlePhase = "running"
  private busy = 0
  private timer: NodeJS.Timeout | undefined
  /** The release or start under way, if any: a start waits for a release to end first. */
  private pending: Promise<void> | undefined
  private stopped = false
  private releases = 0
  private readonly coldStarts = { buckets: coldStartBuckets.map(() => 0), sum: 0, count: 0 }
  private coldStartsFailed = 0
  private lastColdStartS: number | null = null

  constructor(
    private readonly taskId: string,
    readonly releaseAfterS: number,
    private readonly control: () => IdleControl | undefined,
    /** Hears each change of phase. */
    private readonly onPhase: (phase: IdlePhase) => void
  ) {}

  get phase(): IdlePhase {
    return this.phaseNow
  }

  /** The task was deployed without its executors: its first call starts them. */
  deployedReleased(): void {
    this.setPhase("released")
  }

  /** The task's executors are up: its idle time counts from now while no call wants them. */
  started(): void {
    this.arm()
  }

  /**
   * A call wants an executor. Answers undefined when the executors are running, else the start
   * it must wait for (begun by this call when none was under way).
   */
  enter(): Promise<void> | undefined {
    this.busy++
    clearTimeout(this.timer)
    this.timer = undefined
    return this.phaseNow === "running" ? undefined : this.wake()
  }

  /** A call that entered is done with the task's executors (it ended, or never got one). */
  leave(): void {
    this.busy--
    this.arm()
  }

  /** The task is going: no release or start is begun from now on. */
  stop(): void {
    this.stopped = true
    clearTimeout(this.timer)
    this.timer = undefined
  }

  stats(): IdleStats {
    return {
      releaseAfterS: this.releaseAfterS,
      releases: this.releases,
      coldStarts: { ...this.coldStarts, buckets: [...this.coldStarts.buckets] },
      coldStartsFailed: this.coldStartsFailed,
      lastColdStartS: this.lastColdStartS
    }
  }

  /**
   * Starts the executors again (after a release under way, if one is), or answers the start
   * already under way. Answers at once when they are running.
   */
  wake(): Promise<void> {
    if (this.phaseNow === "running") return Promise.resolve()
    if (this.phaseNow === "starting") return this.pending!
    const control = this.control()
    if (this.stopped || control === undefined)
      return Promise.reject(new TaskUnavailable({ message: `task ${this.taskId} is being torn down` }))
    const after = this.pending ?? Promise.resolve()
    const start = after.then(async () => {
      const began = performance.now()
      try {
        await control.start(this.taskId)
      } catch (error) {
        this.coldStartsFailed++
        this.setPhase("released")
        throw new TaskUnavailable({
          message: `task ${this.taskId} could not start its executors again: ${error instanceof Error ? error.message : String(error)}`
        })
      } finally {
        if (this.pending === start) this.pending = undefined
      }
      const seconds = (performance.now() - began) / 1000
      this.lastColdStartS = seconds
      this.coldStarts.sum += seconds
      this.coldStarts.count++
      const bucket = coldStartBuckets.findIndex((bound) => seconds <= bound)
      if (bucket >= 0) this.coldStarts.buckets[bucket]!++
      this.setPhase("running")
      this.arm()
    })
    this.pending = start
    this.setPhase("starting")
    return start
  }

  private setPhase(phase: IdlePhase) {
    this.phaseNow = phase
    this.onPhase(phase)
  }

  /** Counts the idle time down when the executors run and no call wants them. */
  private arm() {
    clearTimeout(this.timer)
    this.timer = undefined
    if (this.stopped || this.releaseAfterS <= 0 || this.busy > 0 || this.phaseNow !== "running") return
    this.timer = setTimeout(() => this.release(), this.releaseAfterS * 1000)
    this.timer.unref()
  }

  private release() {
    this.timer = undefined
    const control = this.control()
    if (this.stopped || control === undefined || this.busy > 0 || this.phaseNow !== "running") return
    this.setPhase("releasing")
    const settle = (released: boolean) => {
      if (released) this.releases++
      if (this.pending === releasing) this.pending = undefined
      if (this.phaseNow !== "releasing") return
      // Left running (the task is going, or its executors could not be stopped): they stay as they are.
      this.setPhase(released ? "released" : "running")
      this.arm()
    }
    const releasing = control.release(this.taskId).then(settle, () => settle(false))
    this.pending = releasing
  }
}

/**
 * Waits for a task's cold start, or fails as the caller leaves (its signal): the start goes on for
 * the calls that still wait.
 */
export const untilStarted = (taskId: string, start: Promise<void>, signal: AbortSignal | undefined): Promise<void> => {
  if (signal === undefined) return start
  if (signal.aborted)
    return Promise.reject(new TaskUnavailable({ message: `the call left while task ${taskId} started` }))
  return new Promise((resolve, reject) => {
    const left = () => reject(new TaskUnavailable({ message: `the call left while task ${taskId} started` }))
    signal.addEventListener("abort", left, { once: true })
    start.then(resolve, reject).finally(() => signal.removeEventListener("abort", left))
  })
}
