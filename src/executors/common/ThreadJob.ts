/**
 * The job a preprocessing thread (ThreadPoolWorker.ts) runs: what the work it starts on the job's
 * behalf reads without every function between taking it as an argument. Media decoders' child
 * processes (media/MediaProcess.ts) end when the job's signal aborts (its request ended) and keep
 * their temporary files in the pool's scratch directory.
 */
import { AsyncLocalStorage } from "node:async_hooks"

export interface ThreadJob {
  /** Aborts when the job is cancelled: its request ended, or another of the request's jobs failed. */
  readonly signal: AbortSignal
  /** Where the job's temporary files go (the executor's run directory, emptied when it starts); undefined: the system's. */
  readonly scratchDir: string | undefined
}

const jobs = new AsyncLocalStorage<ThreadJob>()

/** Runs `work` as `job`: everything it awaits or schedules sees the job. */
export const runAsJob = <A>(job: ThreadJob, work: () => A): A => jobs.run(job, work)

/** The job the caller runs for, or undefined outside a preprocessing thread's job. */
export const currentJob = (): ThreadJob | undefined => jobs.getStore()

/** Why a signal aborted, as an Error. */
export const abortReason = (signal: AbortSignal): Error =>
  signal.reason instanceof Error ? signal.reason : new Error(String(signal.reason ?? "cancelled"))
