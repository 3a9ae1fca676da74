import { Worker } from "node:worker_threads"
import { Effect, Schema, type Scope } from "effect"
import { MediaFailure } from "./media/errors.js"

const workerEntry = new URL("./ThreadPoolWorker.js", import.meta.url)

/**
 * A thread's answer to a job. A media failure travels as its Schema, so the caller gets the same
 * class the preprocessing threw; any other error arrives as a plain Error with its name and message.
 */
export type ThreadReply =
  | { readonly id: number; readonly ok: true; readonly value: unknown }
  | { readonly id: number; readonly ok: false; readonly mediaFailure: typeof MediaFailure.Encoded }
  | { readonly id: number; readonly ok: false; readonly error: { readonly name: string; readonly message: string } }

const decodeMediaFailure = Schema.decodeUnknownSync(MediaFailure)

interface Job {
  readonly resolve: (value: unknown) => void
  readonly reject: (error: Error) => void
}

/**
 * Worker threads that run the functions a module exports (an executor's preprocessing: decoding
 * and resizing media), so that the router's event loop stays free. Jobs go to the thread with the
 * fewest jobs; typed arrays in results are moved, not copied.
 */
export class ThreadPool {
  private readonly jobs: Array<Map<number, Job>>
  private nextId = 0

  private constructor(private readonly threads: ReadonlyArray<Worker>) {
    this.jobs = threads.map(() => new Map())
    threads.forEach((thread, index) => {
      thread.on("message", (message: ThreadReply) => {
        const job = this.jobs[index]!.get(message.id)
        this.jobs[index]!.delete(message.id)
        if (job === undefined) return
        if (message.ok) job.resolve(message.value)
        else if ("mediaFailure" in message) job.reject(decodeMediaFailure(message.mediaFailure))
        else job.reject(Object.assign(new Error(message.error.message), { name: message.error.name }))
      })
      thread.on("error", (error) => {
        for (const job of this.jobs[index]!.values()) job.reject(error)
        this.jobs[index]!.clear()
      })
    })
  }

  static make(moduleUrl: string, size: number): Effect.Effect<ThreadPool, never, Scope.Scope> {
    return Effect.acquireRelease(
      Effect.sync(
        () => new ThreadPool(Array.from({ length: size }, () => new Worker(workerEntry, { workerData: { moduleUrl } })))
      ),
      (pool) => Effect.promise(() => Promise.all(pool.threads.map((thread) => thread.terminate())))
    )
  }

  run<T>(task: string, input: unknown): Promise<T> {
    const index = this.jobs.reduce((best, jobs, candidate) => (jobs.size < this.jobs[best]!.size ? candidate : best), 0)
    const id = this.nextId++
    return new Promise<T>((resolve, reject) => {
      this.jobs[index]!.set(id, { resolve: resolve as (value: unknown) => void, reject })
      this.threads[index]!.postMessage({ id, task, input })
    })
  }
}
