import { mkdir, readdir, readFile, rename, rm, writeFile } from "node:fs/promises"
import { join } from "node:path"
import * as Effect from "effect/Effect"
import * as Schema from "effect/Schema"
import { admissionMaxima, admissionMinima, timeoutBounds } from "../../app-runtime/App.js"
import { ServeConfig } from "../../config/ServeConfig.js"
import { maxOutboundHosts, parseOutboundHost } from "./OutboundProxy.js"

/** A whole number within an admission setting's bounds, the same as an app's own settings are held to. */
const admissionCount = (name: keyof typeof admissionMaxima) =>
  Schema.Int.pipe(Schema.between(admissionMinima[name], admissionMaxima[name]))

/** Admission settings a registration sets over those of the app's definition. */
export const AdmissionOverride = Schema.Struct({
  maxConcurrency: Schema.optional(admissionCount("maxConcurrency")),
  maxQueue: Schema.optional(admissionCount("maxQueue")),
  queueTimeoutMs: Schema.optional(admissionCount("queueTimeoutMs")),
  weight: Schema.optional(Schema.Number.pipe(Schema.greaterThan(0), Schema.lessThanOrEqualTo(1000))),
  maxCallsPerTask: Schema.optional(admissionCount("maxCallsPerTask"))
})
export type AdmissionOverride = typeof AdmissionOverride.Type

/** Hosts (`host` or `host:port`) an app's registration allows it to connect to. */
export const OutboundHosts = Schema.Array(
  Schema.String.pipe(
    Schema.filter((text) => {
      const host = parseOutboundHost(text)
      return typeof host === "string" ? host : true
    })
  )
).pipe(Schema.maxItems(maxOutboundHosts))

/** How long an app's requests may take, streams included: a millisecond to a day. */
export const RequestTimeoutMs = Schema.Int.pipe(Schema.between(timeoutBounds.least, timeoutBounds.most))

/** What is kept of a registered app so that it comes back after a restart. */
export const StoredApp = Schema.Struct({
  id: Schema.String,
  source: Schema.String,
  registeredAt: Schema.String,
  /** Admission settings given at registration, over the app's own. */
  admission: Schema.optional(AdmissionOverride),
  /** The SHA-256 of each API key the app's invoke routes take (given at registration); the keys are not kept. */
  apiKeyDigests: Schema.optional(Schema.Array(Schema.String.pipe(Schema.pattern(/^[0-9a-f]{64}$/)))),
  /** The hosts the app may connect to (given at registration). */
  outboundHosts: Schema.optional(OutboundHosts),
  /** The request timeout given at registration, over the app's own. */
  timeoutMs: Schema.optional(RequestTimeoutMs)
})
export type StoredApp = typeof StoredApp.Type

const decodeStoredApp = Schema.decodeUnknownEither(Schema.parseJson(StoredApp))

/** Registered apps on disk, one JSON file each under `<state-dir>/apps`, written atomically. */
export class AppStore extends Effect.Service<AppStore>()("cornserve/AppStore", {
  effect: Effect.gen(function* () {
    const { stateDir } = yield* ServeConfig
    const dir = join(stateDir, "apps")
    yield* Effect.promise(() => mkdir(dir, { recursive: true }))
    const fileOf = (id: string) => join(dir, `${id}.json`)

    const save = (app: StoredApp) =>
      Effect.promise(async () => {
        const temporary = `${fileOf(app.id)}.${process.pid}.tmp`
        await writeFile(temporary, JSON.stringify(app))
        await rename(temporary, fileOf(app.id))
      })

    const remove = (id: string) => Effect.promise(() => rm(fileOf(id), { force: true }))

    const loadAll = Effect.gen(function* () {
      const names = yield* Effect.promise(() => readdir(dir))
      const apps: Array<StoredApp> = []
      for (const name of names.filter((file) => file.endsWith(".json")).sort()) {
        const text = yield* Effect.promise(() => readFile(join(dir, name), "utf8"))
        const decoded = decodeStoredApp(text)
        if (decoded._tag === "Right") apps.push(decoded.right)
        else yield* Effect.logWarning(`ignoring ${join(dir, name)}: it is not a stored app`)
      }
      return apps
    })

    return { save, remove, loadAll, dir }
  })
}) {}
