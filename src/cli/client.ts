import { bundleApp } from "./AppBundle.js"
import { dataFilesLine, inputListing } from "./AppFiles.js"
import { checkApp, checkAppOnce } from "./AppCheck.js"
import { watch } from "node:fs"
import { readFile } from "node:fs/promises"
import { basename, dirname, extname, resolve as resolvePath } from "node:path"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as ParseResult from "effect/ParseResult"
import * as Queue from "effect/Queue"
import * as Schema from "effect/Schema"
import {
  AppDocument,
  ErrorAnswer,
  RegistrationFailed,
  RegistrationProgress,
  type TaskList,
  type TaskSettingsListing,
  TaskProfileAnswer
} from "../control/gateway/GatewayAnswers.js"
import { responseLines } from "../control/ResponseLines.js"
import { CliFailure, callAdmin, type GatewayTarget } from "./AdminClient.js"
import { SchemaText } from "./SchemaText.js"
import {
  LevelMeasured,
  RecordedProfile,
  RecordingDone,
  type RecordRequest
} from "../control/task-manager/ProfileRecording.js"

export { CliFailure, type GatewayTarget }

const request = (target: GatewayTarget, method: string, path: string, body?: unknown) =>
  Effect.tryPromise({
    try: () =>
      fetch(new URL(path, target.url.endsWith("/") ? target.url : `${target.url}/`), {
        method,
        headers: {
          // Admin routes take only JSON, so that a cross-site form cannot reach them.
          ...(method === "POST" ? { "content-type": "application/json" } : {}),
          ...(target.token === undefined ? {} : { authorization: `Bearer ${target.token}` })
        },
        ...(body === undefined ? {} : { body: typeof body === "string" ? body : JSON.stringify(body) })
      }),
    catch: (error) =>
      new CliFailure({
        message: `cannot reach the gateway at ${target.url}: ${(error as Error).cause instanceof Error ? ((error as Error).cause as Error).message : (error as Error).message}`
      })
  })

const readText = (response: Response) => Effect.promise(() => response.text())

/** What a client makes of an answer that is not what the route answers: a gateway of another version. */
const unreadable = (what: string, error: ParseResult.ParseError) =>
  new CliFailure({
    message: `the gateway's ${what} is not one this client reads: ${ParseResult.TreeFormatter.formatErrorSync(error)}`
  })

/** A JSON text as the route's answer, or a failure that says which answer did not decode, and why. */
const decodeText = <A, I>(schema: Schema.Schema<A, I>, what: string) => {
  const decode = Schema.decodeUnknownEither(Schema.parseJson(schema))
  return (text: string): Either.Either<A, CliFailure> =>
    Either.mapLeft(decode(text), (error) => unreadable(what, error))
}

/** A response's body as the route's answer. */
const _readAnswer = <A, I>(schema: Schema.Schema<A, I>, what: string) => {
  const decode = decodeText(schema, what)
  return (response: Response) => Effect.flatMap(readText(response), decode)
}

const decodeErrorAnswer = Schema.decodeUnknownEither(Schema.parseJson(ErrorAnswer))

/** An error answer as `message (code)`; undefined when the text is not one. */
const errorAnswerOf = (text: string): string | undefined =>
  Either.match(decodeErrorAnswer(text), {
    onLeft: () => undefined,
    onRight: ({ error }) => `${error.message} (${error.code})`
  })

/** The server's own message for a failed response (its text, when it is not an error answer). */
const failureOf = (response: Response) =>
  Effect.flatMap(readText(response), (text) =>
    Effect.fail(new CliFailure({ message: `error ${response.status}: ${errorAnswerOf(text) ?? text}` }))
  )

const expectOk = (response: Response) => (response.ok ? Effect.succeed(response) : failureOf(response))

const write = (text: string) => Effect.sync(() => process.stdout.write(text))

const decodeRegistrationProgress = decodeText(RegistrationProgress, "registration event")
const decodeRegistrationFailed = decodeText(RegistrationFailed, "registration failure")

/**
 * What registering an app takes on this machine before anything is sent: its bundle (refused when
 * it cannot run, or would take a file from outside the app's folder) and its type check. The
 * packages and data files bundled are said, so that an author sees what goes with the app.
 */
const prepareApp = (file: string, check: boolean) =>
  Effect.gen(function* () {
    // The npm packages (and local modules) it imports go with it, bundled from its own folder.
    const bundle = yield* Effect.tryPromise({
      try: () => bundleApp(file),
      catch: (error) => new CliFailure({ message: `cannot read ${file}: ${(error as Error).message}` })
    })
    if (bundle._tag === "Refused") {
      return yield* new CliFailure({ message: `${file} cannot be registered:\n${bundle.message}` })
    }
    // CORNSERVE_APP_CHECK=off skips it as --no-check does (a pipeline that checks apps in a step of its own).
    if (check && process.env.CORNSERVE_APP_CHECK !== "off") {
      yield* typeCheck(
        file,
        "register",
        bundle.inputs.map((input) => input.path)
      )
    }
    if (bundle.packages.length > 0) process.stderr.write(`  bundled with ${bundle.packages.join(", ")}\n`)
    const dataFiles = dataFilesLine(bundle.inputs)
    if (dataFiles !== undefined) process.stderr.write(`  ${dataFiles}\n`)
    return bundle
  })

/** `app register --dry-run`: what registering the app would send, file by file; nothing is sent. */
export const previewRegistration = (file: string, name: string | undefined, check = true) =>
  Effect.gen(function* () {
    const { source, inputs } = yield* prepareApp(file, check)
    const appName = name ?? basename(file, extname(file))
    yield* write(
      `would register ${appName} from ${inputListing(inputs, Buffer.byteLength(source))}\n` +
        "nothing was sent (--dry-run)\n"
    )
  })

export const registerApp = (
  target: GatewayTarget,
  file: string,
  name: string | undefined,
  replace: boolean,
  admission?: {
    readonly maxConcurrency?: number
    readonly maxQueue?: number
    readonly queueTimeoutMs?: number
    readonly weight?: number
    readonly maxCallsPerTask?: number
  },
  apiKeys: ReadonlyArray<string> = [],
  allowHosts: ReadonlyArray<string> = [],
  timeoutMs?: number,
  check = true
) =>
  Effect.gen(function* () {
    const bundle = yield* prepareApp(file, check)
    const source = bundle.source
    const appName = name ?? basename(file, extname(file))
    const response = yield* Effect.flatMap(
      request(target, "POST", "app/register", {
        source,
        name: appName,
        replace,
        ...(admission === undefined ? {} : { admission }),
        ...(apiKeys.length === 0 ? {} : { apiKeys }),
        ...(allowHosts.length === 0 ? {} : { allowHosts }),
        ...(timeoutMs === undefined ? {} : { timeoutMs })
      }),
      expectOk
    )
    let event = "message"
    const outcome = yield* Effect.promise(async (): Promise<Either.Either<string, CliFailure> | undefined> => {
      for await (const line of responseLines(response)) {
        if (line.startsWith("event: ")) event = line.slice("event: ".length)
        else if (line.startsWith("data: ")) {
          const data = line.slice("data: ".length)
          if (event === "progress") {
            const progress = decodeRegistrationProgress(data)
            if (Either.isLeft(progress)) return Either.left(progress.left)
            process.stderr.write(`  ${progress.right.message}\n`)
          } else if (event === "final") return Either.map(decodeRegistrationProgress(data), (final) => final.message)
          else if (event === "error")
            return Either.flatMap(decodeRegistrationFailed(data), ({ error }) =>
              Either.left(new CliFailure({ message: `registration of ${appName} failed: ${error.message}` }))
            )
        }
      }
      return undefined
    })
    if (outcome === undefined)
      return yield* new CliFailure({ message: "the gateway closed the registration stream without an outcome" })
    const message = yield* outcome
    yield* write(`${message}\n`)
  })

/** Type-checks an app; fails listing its errors (`file:line:col`), for `app check` and `app register`. */
const typeCheck = (file: string, what: "check" | "register", inputs?: ReadonlyArray<string>) =>
  Effect.gen(function* () {
    const { errors } = yield* Effect.tryPromise({
      try: () => (inputs === undefined ? checkApp(file) : checkAppOnce(file, inputs)),
      catch: (error) => new CliFailure({ message: `cannot type-check ${file}: ${(error as Error).message}` })
    })
    if (errors.length === 0) return
    return yield* new CliFailure({
      message:
        `${file} has ${errors.length} type error(s)` +
        `${what === "register" ? " (app register --no-check registers it anyway)" : ""}:\n${errors.join("\n")}`
    })
  })

/** `app check FILE`: its type errors, or that it has none. */
export const checkAppFile = (file: string) =>
  Effect.zipRight(typeCheck(file, "check"), write(`${file}: no type errors\n`))

export const unregisterApp = (target: GatewayTarget, appId: string) =>
  Effect.gen(function* () {
    const body = yield* callAdmin(target, "answer to unregister", (client) =>
      client.apps.unregisterApp({ path: { id: appId } })
    )
    yield* write(`${body.message}\n`)
  })

const table = (header: ReadonlyArray<string>, rows: ReadonlyArray<ReadonlyArray<string>>): string => {
  const widths = header.map((title, column) => Math.max(title.length, ...rows.map((row) => row[column]!.length)))
  const format = (row: ReadonlyArray<string>) =>
    row
      .map((cell, column) => cell.padEnd(widths[column]!))
      .join("  ")
      .trimEnd()
  return `${[format(header), ...rows.map(format)].join("\n")}\n`
}

/** An app's log as the gateway keeps it: text, printed as it is. */
export const appLogs = (target: GatewayTarget, appId: string, follow = false) =>
  Effect.gen(function* () {
    const path = `app/logs/${encodeURIComponent(appId)}${follow ? "?follow=1" : ""}`
    const response = yield* Effect.flatMap(request(target, "GET", path), expectOk)
    if (!follow) return yield* write(yield* readText(response))
    // Printed as it comes, until the gateway goes (or Ctrl-C).
    yield* Effect.promise(async () => {
      const reader = response.body?.getReader()
      if (reader === undefined) return
      const decoder = new TextDecoder()
      for (;;) {
        const { done, value } = await reader.read().catch(() => ({ done: true, value: undefined }))
        if (done) return
        process.stdout.write(decoder.decode(value, { stream: true }))
      }
    })
  })

/** An app's limits in a table cell: at most N at once, M queued for S, each request within T ("-": none). */
const limitsText = (app: {
  readonly admission?:
    | { readonly maxConcurrency: number; readonly maxQueue: number; readonly queueTimeoutMs: number }
    | undefined
  readonly timeoutMs?: number | undefined
}): string => {
  const parts: Array<string> = []
  if (app.admission !== undefined) {
    const { maxConcurrency, maxQueue, queueTimeoutMs } = app.admission
    parts.push(`${maxConcurrency} at once`)
    if (maxQueue > 0) parts.push(`${maxQueue} queued ≤ ${queueTimeoutMs / 1000} s`)
  }
  if (app.timeoutMs !== undefined) parts.push(`timeout ${app.timeoutMs / 1000} s`)
  return parts.join(", ") || "-"
}

export const listApps = (target: GatewayTarget) =>
  Effect.gen(function* () {
    const { apps } = yield* callAdmin(target, "list of apps", (client) => client.apps.listApps())
    if (apps.length === 0) return yield* write("no apps are registered\n")
    yield* write(
      table(
        ["APP", "STATE", "IN FLIGHT", "QUEUED", "LIMITS", "TASKS"],
        apps.map((app) => [
          app.id,
          app.error === undefined ? app.state : `${app.state}: ${app.error}`,
          String(app.inFlight),
          String(app.queued),
          limitsText(app),
          app.tasks.map((task) => task.name).join(", ") || "-"
        ])
      )
    )
  })

/**
 * `app describe ID`: what the app does, the request it takes and the answer it gives (from its
 * OpenAPI document), and its example; with `json`, the document itself.
 */
export const describeApp = (target: GatewayTarget, appId: string, json: boolean) =>
  Effect.gen(function* () {
    const whole = yield* callAdmin(target, "app document", (client) => client.apps.appDocument({ path: { id: appId } }))
    if (json) return yield* write(`${JSON.stringify(whole, null, 2)}\n`)
    const document = yield* Schema.decodeUnknown(AppDocument)(whole).pipe(
      Effect.mapError((error) => unreadable("app document", error))
    )
    const schemas = new SchemaText(document.components?.schemas ?? {})
    const out: Array<string> = [document.info.title]
    if (document.info.description !== undefined) out.push(`  ${document.info.description}`)
    for (const [path, item] of Object.entries(document.paths)) {
      const operation = item.post
      if (operation === undefined || !path.startsWith("/app/invoke/")) continue
      const body = operation.requestBody?.content["application/json"]
      out.push("", `Request: POST ${path} (application/json)`, ...schemas.lines(body?.schema))
      const answer = operation.responses?.["200"]?.content ?? {}
      const kinds = Object.keys(answer)
      const shape = kinds.includes("application/json")
        ? kinds.includes("application/x-ndjson")
          ? "one JSON value, or a stream of them, one per line (NDJSON)"
          : "one JSON value"
        : "a stream of JSON values, one per line (NDJSON)"
      const line = answer["application/json"] ?? answer["application/x-ndjson"]
      out.push("", `Response: ${shape}`, ...schemas.lines(line?.schema))
      if (body?.example !== undefined) {
        out.push(
          "",
          "Example request:",
          ...JSON.stringify(body.example, null, 2)
            .split("\n")
            .map((row) => `  ${row}`)
        )
      }
    }
    const openAi = Object.keys(document.paths).filter((path) => path.includes("/v1/"))
    if (openAi.length > 0) out.push("", "OpenAI's API:", ...openAi.map((path) => `  ${path}`))
    yield* write(`${out.join("\n")}\n`)
  })

/** A task's scale to zero as `tasks list` prints it: after how long, and its last cold start. */
const idleReleaseText = (idle: (typeof TaskList.Type)["tasks"][number]["idleRelease"]) => {
  if (idle === undefined || idle.releaseAfterS <= 0) return "never"
  const last = idle.lastColdStartS === null ? "" : `, last cold start ${idle.lastColdStartS.toFixed(1)} s`
  return `after ${idle.releaseAfterS} s${last}`
}

export const listTasks = (target: GatewayTarget) =>
  Effect.gen(function* () {
    const { tasks } = yield* callAdmin(target, "list of tasks", (client) => client.tasks.listTasks())
    if (tasks.length === 0) return yield* write("no tasks are deployed\n")
    yield* write(
      table(
        ["TASK", "NAME", "KIND", "STATE", "IDLE RELEASE", "SETTINGS", "USED BY", "DEVICES", "EXECUTORS (NODE)"],
        tasks.map((task) => [
          task.id,
          task.name,
          task.kind,
          task.state,
          idleReleaseText(task.idleRelease),
          settingsText(task.settings),
          task.usedBy.join(", "),
          task.devices.join(", "),
          task.executors
            .map((executor) => `${executor.id} (${executor.node}${executor.healthy ? "" : ", unhealthy"})`)
            .join(", ")
        ])
      )
    )
  })

/** A byte count as people read it: 512 MiB, 1.5 GiB, 300 KiB, 17 B. */
const bytesText = (bytes: number): string => {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"]
  let value = bytes
  let unit = 0
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024
    unit++
  }
  return `${Number.isInteger(value) ? value : value.toFixed(1)} ${units[unit]}`
}

/** A task's settings on one line: `maxBatchSize=4 kvCacheBytes=16 MiB ...`. */
const settingsText = (settings: typeof TaskSettingsListing.Type): string =>
  Object.entries(settings)
    .map(([key, value]) => `${key}=${typeof value === "number" && key.endsWith("Bytes") ? bytesText(value) : value}`)
    .join(" ")

/** `tasks show ID`: one task, its config as the app declared it and the settings its executors run with. */
export const showTask = (target: GatewayTarget, given: string, json: boolean) =>
  Effect.gen(function* () {
    const taskId = yield* resolveTaskId(target, given)
    const { tasks } = yield* callAdmin(target, "list of tasks", (client) => client.tasks.listTasks())
    const task = tasks.find((entry) => entry.id === taskId)
    if (task === undefined) return yield* new CliFailure({ message: `no task ${given} is deployed` })
    if (json) return yield* write(`${JSON.stringify(task, null, 2)}\n`)
    const width = Math.max(...Object.keys(task.settings).map((key) => key.length))
    yield* write(
      `${[
        `task ${task.id} (${task.name}, ${task.kind}): ${task.state}`,
        `used by: ${task.usedBy.join(", ") || "-"}`,
        `devices: ${task.devices.join(", ") || "-"}`,
        `executors: ${task.executors.map((executor) => `${executor.id} (${executor.node}${executor.healthy ? "" : ", unhealthy"})`).join(", ") || "-"}`,
        `config: ${JSON.stringify(task.config)}`,
        "settings:",
        ...Object.entries(task.settings).map(
          ([key, value]) =>
            `  ${key.padEnd(width)}  ${typeof value === "number" && key.endsWith("Bytes") ? `${value} (${bytesText(value)})` : value}`
        )
      ].join("\n")}\n`
    )
  })

/**
 * The id of the task `given` names: an id as is, or a name `tasks list` prints when exactly one
 * task has it (several tasks of one model differ in their config: their ids tell them apart); a
 * text that is neither goes to the gateway as it is, which answers that no such task is deployed.
 */
export const resolveTaskId = (target: GatewayTarget, given: string) =>
  Effect.gen(function* () {
    const { tasks } = yield* callAdmin(target, "list of tasks", (client) => client.tasks.listTasks())
    if (tasks.some((task) => task.id === given)) return given
    const named = tasks.filter((task) => task.name === given)
    if (named.length === 1) return named[0]!.id
    if (named.length > 1) {
      return yield* new CliFailure({
        message: `${named.length} tasks are named ${given}: name one by its id (${named.map((task) => task.id).join(", ")})`
      })
    }
    // Neither an id nor a name here: the gateway's answer says so (404 TaskNotFound).
    return given
  })

/** `tasks scale ID ±N`: N devices more (+) or fewer (-); prints where the task's executors run then. */
export const scaleTask = (target: GatewayTarget, given: string, devices: number) =>
  Effect.gen(function* () {
    const taskId = yield* resolveTaskId(target, given)
    const { tasks } = yield* callAdmin(target, "answer to scale", (client) =>
      client.tasks.scaleTask({ payload: { taskId, devices } })
    )
    const task = tasks.find((entry) => entry.id === taskId)
    if (task === undefined) return yield* write(`task ${taskId} is scaled\n`)
    yield* write(
      `task ${taskId} has ${task.executors.length} executor(s) on ${task.devices.join(", ") || "no device"}\n`
    )
  })

/** A throughput–latency curve per executor count, as a table; undefined when it has no point. */
const curveTable = (curves: RecordedProfile["curves"]): string | undefined => {
  const points = curves.flatMap((curve) => curve.points.map((point) => [curve.executors, point] as const))
  if (points.length === 0) return undefined
  return table(
    ["EXECUTORS", "LOAD", "CALLS", "P50 MS", "P95 MS", "P99 MS", "CALLS/S"],
    points.map(([executors, point]) => [
      String(executors),
      point.levelFrom === point.levelTo ? String(point.levelTo) : `${point.levelFrom}-${point.levelTo}`,
      String(point.calls),
      String(point.p50Ms),
      String(point.p95Ms),
      String(point.p99Ms),
      String(point.callsPerSecond)
    ])
  )
}

/** A recorded profile: when and how it was recorded, then its curve. */
const recordedSection = (recorded: RecordedProfile): string =>
  `recorded ${recorded.recordedAt} (load ${recorded.levels.join(", ")}; ${recorded.secondsPerLevel} s each): ` +
  `${recorded.calls} call(s), ${recorded.failed} failed\n` +
  (curveTable(recorded.curves) ?? "no call succeeded\n")

/** A latency of no call at all (NaN, null in JSON) as a dash. */
const milliseconds = (value: number) => (Number.isNaN(value) ? "-" : String(value))

/**
 * `tasks profile ID`: the task's throughput–latency curve per executor count as its calls measured
 * it, its rate and queues; then the curve recorded ahead of time, if one was.
 */
export const showTaskProfile = (target: GatewayTarget, given: string, json: boolean) =>
  Effect.gen(function* () {
    const taskId = yield* resolveTaskId(target, given)
    const profile = yield* callAdmin(target, "task profile", (client) =>
      client.tasks.taskProfile({ path: { id: taskId } })
    )
    if (json) return yield* write(`${JSON.stringify(Schema.encodeSync(TaskProfileAnswer)(profile))}\n`)
    const { recent, queueDepth } = profile
    yield* write(
      `task ${profile.taskId} (${profile.name}, ${profile.kind}): ${profile.executors} executor(s); ` +
        `${profile.calls} call(s), ${profile.failed} failed\n` +
        `last ${recent.windowSeconds} s: ${recent.callsPerSecond} calls/s, p50 ${milliseconds(recent.p50Ms)} ms, ` +
        `p99 ${milliseconds(recent.p99Ms)} ms; in the executors: mean ${queueDepth.mean}, max ${queueDepth.max} call(s)\n` +
        (curveTable(profile.curves) ?? "no call measured yet\n")
    )
    if (profile.recorded !== null) yield* write(`\n${recordedSection(profile.recorded)}`)
  })

const decodeLevel = Schema.decodeUnknownSync(Schema.parseJson(LevelMeasured))
const decodeDone = Schema.decodeUnknownSync(Schema.parseJson(RecordingDone))

/**
 * `tasks profile ID --record`: the platform drives a load sweep against the task's executors; each
 * level's measure is told as it ends (on stderr), then the recorded curve is printed (or, with
 * `--json`, the recorded profile).
 */
export const recordTaskProfile = (
  target: GatewayTarget,
  given: string,
  sweep: typeof RecordRequest.Encoded,
  json: boolean
) =>
  Effect.gen(function* () {
    const taskId = yield* resolveTaskId(target, given)
    const response = yield* Effect.flatMap(
      request(target, "POST", `tasks/${encodeURIComponent(taskId)}/profile/record`, sweep),
      expectOk
    )
    process.stderr.write(
      `recording task ${taskId}` +
        `${sweep.levels === undefined ? "" : ` at load ${sweep.levels.join(", ")}`}` +
        `${sweep.secondsPerLevel === undefined ? "" : `, ${sweep.secondsPerLevel} s each`}\n`
    )
    let event = "message"
    const outcome = yield* Effect.promise(async () => {
      for await (const line of responseLines(response)) {
        if (line.startsWith("event: ")) event = line.slice("event: ".length)
        else if (line.startsWith("data: ")) {
          const data = line.slice("data: ".length)
          if (event === "progress") {
            const level = decodeLevel(data)
            process.stderr.write(
              `  load ${level.level} (${level.executors} executor(s)): ${level.calls} call(s), ${level.failed} failed ` +
                `in ${level.seconds} s; ${level.callsPerSecond} calls/s, p50 ${Number.isNaN(level.p50Ms) ? "-" : level.p50Ms} ms\n`
            )
          } else if (event === "final") return { done: decodeDone(data) }
          else if (event === "error")
            return { failed: errorAnswerOf(data) ?? `the gateway's failure is not one this client reads: ${data}` }
        }
      }
      return { failed: "the gateway closed the recording's stream without an outcome" }
    })
    if ("failed" in outcome)
      return yield* new CliFailure({ message: `recording the profile of ${taskId} failed: ${outcome.failed}` })
    const { done } = outcome
    if (json) return yield* write(`${JSON.stringify(Schema.encodeSync(RecordedProfile)(done.recorded))}\n`)
    process.stderr.write(`${done.message}\n`)
    yield* write(recordedSection(done.recorded))
  })

export const listNodes = (target: GatewayTarget) =>
  Effect.gen(function* () {
    const { nodes } = yield* callAdmin(target, "list of nodes", (client) => client.tasks.listNodes())
    if (nodes.length === 0) return yield* write("no nodes: the control plane has no devices and no node has joined\n")
    yield* write(
      table(
        ["NODE", "ROLE", "ADDRESS", "STATE", "DEVICES"],
        nodes.map((node) => [
          node.name,
          node.role,
          node.address,
          node.state,
          node.devices
            .map((device) => {
              const tasks = device.tasks ?? (device.task === null ? [] : [device.task])
              return tasks.length === 0 ? device.id : `${device.id} (${tasks.join(", ")})`
            })
            .join(", ")
        ])
      )
    )
  })

/** `--data`: literal JSON, `@file`, or `-` for standard input. */
const readData = (data: string) =>
  Effect.gen(function* () {
    const text =
      data === "-"
        ? yield* Effect.promise(async () => {
            const chunks: Array<Buffer> = []
            for await (const chunk of process.stdin) chunks.push(chunk as Buffer)
            return Buffer.concat(chunks).toString("utf8")
          })
        : data.startsWith("@")
          ? yield* Effect.tryPromise({
              try: () => readFile(data.slice(1), "utf8"),
              catch: (error) => new CliFailure({ message: `cannot read ${data.slice(1)}: ${(error as Error).message}` })
            })
          : data
    try {
      JSON.parse(text)
    } catch (error) {
      return yield* new CliFailure({ message: `--data is not JSON: ${(error as Error).message}` })
    }
    return text
  })

/** The value at a dot path such as `choices.0.delta.content` (numbers index arrays). */
export const valueAt = (value: unknown, path: string): unknown =>
  path
    .split(".")
    .reduce<unknown>(
      (current, key) =>
        typeof current === "object" && current !== null ? (current as Record<string, unknown>)[key] : undefined,
      value
    )

const isErrorAnswer = Schema.is(ErrorAnswer)

/** A streamed line that is only an error answer (an app's own lines may carry an `error` of theirs) ends the stream. */
const streamFailure = (line: unknown): string | undefined =>
  isErrorAnswer(line) && Object.keys(line).length === 1 ? `${line.error.message} (${line.error.code})` : undefined

export const invokeApp = (target: GatewayTarget, appId: string, data: string, aggregate: string | undefined) =>
  Effect.gen(function* () {
    const body = yield* readData(data)
    const response = yield* Effect.flatMap(
      request(target, "POST", `app/invoke/${encodeURIComponent(appId)}`, body),
      expectOk
    )
    if (!(response.headers.get("content-type") ?? "").includes("ndjson")) {
      const text = yield* readText(response)
      return yield* write(`${JSON.stringify(JSON.parse(text), null, 2)}\n`)
    }
    const failure = yield* Effect.promise(async () => {
      for await (const line of responseLines(response)) {
        if (line.trim().length === 0) continue
        const parsed: unknown = JSON.parse(line)
        const failure = streamFailure(parsed)
        if (failure !== undefined) return failure
        if (aggregate === undefined) process.stdout.write(`${line}\n`)
        else {
          const piece = valueAt(parsed, aggregate)
          if (piece !== undefined && piece !== null)
            process.stdout.write(typeof piece === "string" ? piece : JSON.stringify(piece))
        }
      }
      if (aggregate !== undefined) process.stdout.write("\n")
      return undefined
    })
    if (failure !== undefined) return yield* new CliFailure({ message: `the stream failed: ${failure}` })
  })

/**
 * `app dev FILE`: registers the app (replacing a running version), prints its log as it writes it,
 * and registers it again each time a file of its folder changes (node_modules aside). The folder is
 * watched before the first registration, so that a save made while one runs (its type check takes
 * seconds) is registered after it. A failed registration (a syntax error, a package that cannot be
 * bundled, an app that fails to load) is printed and the running version keeps serving; the next
 * save tries again.
 */
export const developApp = (target: GatewayTarget, file: string, name: string | undefined) =>
  Effect.gen(function* () {
    const appName = name ?? basename(file, extname(file))
    const folder = dirname(resolvePath(file))
    const changes = yield* Queue.sliding<void>(1)
    const watcher = watch(folder, { recursive: true }, (_, changed) => {
      if (changed !== null && /(^|[\\/])(node_modules|\.git)([\\/]|$)/.test(changed)) return
      changes.unsafeOffer(undefined)
    })
    yield* Effect.addFinalizer(() => Effect.sync(() => watcher.close()))
    let following = false
    const registerOnce = Effect.gen(function* () {
      const started = Date.now()
      // Registered at once; the type check (seconds) follows, and says what it finds.
      const outcome = yield* Effect.either(
        registerApp(target, file, appName, true, undefined, [], [], undefined, false)
      )
      if (outcome._tag === "Left") {
        process.stderr.write(`cornserve: ${outcome.left.message}\n`)
        return
      }
      process.stderr.write(`  (${Date.now() - started} ms; watching ${folder} for changes)\n`)
      const checked = yield* Effect.either(typeCheck(file, "check"))
      if (checked._tag === "Left") process.stderr.write(`cornserve: ${checked.left.message}\n`)
      if (!following) {
        following = true
        yield* Effect.forkDaemon(
          Effect.catchAll(appLogs(target, appName, true), (error) =>
            Effect.sync(() => process.stderr.write(`cornserve: the app's log stopped: ${error.message}\n`))
          )
        )
      }
    })
    yield* registerOnce
    for (;;) {
      yield* Queue.take(changes)
      // An editor writes a file in several steps: the last of them is the one registered.
      yield* Effect.sleep("100 millis")
      yield* Queue.takeAll(changes)
      process.stderr.write(`${file} changed; registering ${appName} again\n`)
      yield* registerOnce
    }
  }).pipe(Effect.scoped)
