/**
 * The apps' schemas, off the main thread. The schemas an app's process sends when it loads come from
 * the app's code: reading them (bounded, then cleaned: `readAppSchemas`) and writing the OpenAPI
 * documents that show them (`gateway/OpenApi.ts`) is linear in their size, yet takes tens of
 * milliseconds at their bounds, which the event loop that serves every request must not spend. A
 * worker thread of the control plane does both.
 *
 * Between the threads the schemas travel as text, never as objects: copying a string is a memcpy,
 * while cloning a schema's objects costs the main thread as much as cleaning them. The main thread
 * keeps each app's cleaned schemas as text, and the last documents it was given, so that readers
 * asking again cost it a look-up.
 */
import { Worker } from "node:worker_threads"
import type { AppSchemas, AppSchemasWire, JsonSchema } from "../app-runtime/driver/AppSchemas.js"
import type { AppDescription, PlatformAuth, UndescribedApp } from "./AppDescriptions.js"

/**
 * An app's schemas as the platform keeps them: cleaned (`readAppSchemas`), as the JSON text of
 * `{ request, response?, defs: [[name, schema], ...] }`. Only the schema thread parses it.
 */
export interface CleanedSchemas {
  readonly json: string
  readonly streams: boolean
}

/** An app whose schemas a document shows, as the main thread hands it to the schema thread. */
export type DescribedAppText = AppDescription<CleanedSchemas>

export type { PlatformAuth, UndescribedApp }

/** `schemas` as the text the main thread keeps. */
export const cleanedSchemasOf = (schemas: AppSchemas): CleanedSchemas => ({
  json: JSON.stringify({
    request: schemas.request,
    ...(schemas.response === undefined ? {} : { response: schemas.response }),
    defs: [...schemas.defs]
  }),
  streams: schemas.streams
})

/** The schemas `cleaned` holds, as the documents take them. */
export const appSchemasOf = (cleaned: CleanedSchemas): AppSchemas => {
  const parsed = JSON.parse(cleaned.json) as {
    readonly request: JsonSchema
    readonly response?: JsonSchema
    readonly defs: ReadonlyArray<readonly [string, JsonSchema]>
  }
  return { request: parsed.request, response: parsed.response, defs: new Map(parsed.defs), streams: cleaned.streams }
}

/** The schemas of an app whose process sent none: it takes and answers any JSON. */
export const undescribedCleanedSchemas: CleanedSchemas = { json: '{"request":{},"defs":[]}', streams: false }

/** What the main thread asks the schema thread. */
export type SchemaJob =
  | { readonly id: number; readonly kind: "read"; readonly wire: AppSchemasWire }
  | { readonly id: number; readonly kind: "appDocument"; readonly app: DescribedAppText }
  | {
      readonly id: number
      readonly kind: "platformDocument"
      readonly apps: ReadonlyArray<DescribedAppText | UndescribedApp>
      readonly auth: PlatformAuth
    }

/** What a read answers: the cleaned schemas, or why they are refused. */
export type SchemasRead = { readonly schemas: CleanedSchemas } | { readonly refused: string }

/** The schema thread's answer to a job: a document as JSON text, or a read. */
export type SchemaReply =
  | { readonly id: number; readonly ok: true; readonly value: string | SchemasRead }
  | { readonly id: number; readonly ok: false; readonly message: string }

const workerEntry = new URL("./SchemaThreadWorker.js", import.meta.url)

/** Documents kept for readers who ask again: each reader's view of the apps is one of few. */
const keptDocuments = 8

/** The schema thread's heap: the documents of many apps at their bounds fit many times over. */
const threadHeapMiB = 512

interface Job {
  readonly resolve: (value: string | SchemasRead) => void
  readonly reject: (error: Error) => void
}

/**
 * The worker thread that reads apps' schemas and writes their documents. Started on first use and
 * kept; a thread that fails (its heap's bound, a bug) fails the jobs it held, and the next job starts
 * another. It never keeps the process alive on its own.
 */
export class SchemaThread {
  private thread: Worker | undefined
  private readonly jobs = new Map<number, Job>()
  private nextId = 0
  /** The documents last written, by what they were written from, oldest first. */
  private readonly documents = new Map<string, Promise<string>>()
  /** A number for each app's cleaned schemas (each load's are an object of their own), for the documents' keys. */
  private readonly schemaIds = new WeakMap<CleanedSchemas, number>()
  private nextSchemaId = 0
  private closed = false

  /** `entry`: the thread's script (the platform's; a test's stand-in). */
  constructor(private readonly entry: URL = workerEntry) {}

  /** The schemas an app's process sent, read and cleaned, or why they are refused. */
  async read(wire: AppSchemasWire): Promise<CleanedSchemas | string> {
    const read = (await this.run({ id: this.nextId++, kind: "read", wire })) as SchemasRead
    return "refused" in read ? read.refused : read.schemas
  }

  /** `GET /app/:id/openapi.json`, as JSON text. */
  appDocument(app: DescribedAppText): Promise<string> {
    return this.document(this.keyOf("app", [app]), () => ({ id: this.nextId++, kind: "appDocument", app }))
  }

  /** `GET /openapi.json`, as JSON text. */
  platformDocument(apps: ReadonlyArray<DescribedAppText | UndescribedApp>, auth: PlatformAuth): Promise<string> {
    return this.document(this.keyOf(`platform ${auth.adminToken} ${auth.metricsToken}`, apps), () => ({
      id: this.nextId++,
      kind: "platformDocument",
      apps,
      auth
    }))
  }

  /** Ends the thread; what it held fails. */
  async close(): Promise<void> {
    this.closed = true
    const thread = this.thread
    this.thread = undefined
    this.failAll(new Error("the schema thread was stopped"))
    await thread?.terminate()
  }

  /** What a document is written from: each app's id, its schemas (by their number) and what the reader sees of it. */
  private keyOf(what: string, apps: ReadonlyArray<DescribedAppText | UndescribedApp>): string {
    return JSON.stringify([
      what,
      apps.map((app) =>
        "schemas" in app ? [app.id, this.schemaId(app.schemas), app.needsApiKey, app.registeredAt] : app
      )
    ])
  }

  private schemaId(schemas: CleanedSchemas): number {
    let id = this.schemaIds.get(schemas)
    if (id === undefined) {
      id = this.nextSchemaId++
      this.schemaIds.set(schemas, id)
    }
    return id
  }

  private document(key: string, job: () => SchemaJob): Promise<string> {
    const kept = this.documents.get(key)
    this.documents.delete(key)
    const document = kept ?? (this.run(job()) as Promise<string>)
    this.documents.set(key, document)
    if (this.documents.size > keptDocuments) this.documents.delete(this.documents.keys().next().value!)
    if (kept === undefined) document.catch(() => this.documents.delete(key))
    return document
  }

  private run(job: SchemaJob): Promise<string | SchemasRead> {
    if (this.closed) return Promise.reject(new Error("the schema thread was stopped"))
    const thread = this.started()
    return new Promise((resolve, reject) => {
      this.jobs.set(job.id, { resolve, reject })
      thread.postMessage(job)
    })
  }

  private started(): Worker {
    if (this.thread !== undefined) return this.thread
    const thread = new Worker(this.entry, { resourceLimits: { maxOldGenerationSizeMb: threadHeapMiB } })
    thread.unref()
    thread.on("message", (reply: SchemaReply) => {
      const job = this.jobs.get(reply.id)
      this.jobs.delete(reply.id)
      if (job === undefined) return
      if (reply.ok) job.resolve(reply.value)
      else job.reject(new Error(reply.message))
    })
    const lost = (error: Error) => {
      if (this.thread !== thread) return
      this.thread = undefined
      this.failAll(error)
    }
    thread.on("error", lost)
    thread.on("exit", (code) => lost(new Error(`the schema thread stopped (exit code ${code})`)))
    this.thread = thread
    return thread
  }

  private failAll(error: Error) {
    const jobs = [...this.jobs.values()]
    this.jobs.clear()
    for (const job of jobs) job.reject(error)
  }
}
