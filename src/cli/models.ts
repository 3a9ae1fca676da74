import * as Console from "effect/Console"
import * as Effect from "effect/Effect"
import type { Dtype } from "../models/Dtype.js"
import { type ModelDownloadEvent, parseHubId, resolveHubModel } from "../models/Hub.js"
import { benchModelNames, buildModel, builtinModelNames, modelCacheDir, unknownBuiltin } from "../models/ModelStore.js"
import { CliFailure } from "./client.js"

/** `cornserve models build [NAME...] [--dir DIR]`: every built-in by default. */
export const buildModels = (names: ReadonlyArray<string>, dir: string | undefined) =>
  Effect.gen(function* () {
    const chosen = names.length > 0 ? names : builtinModelNames
    for (const name of chosen) {
      const started = performance.now()
      const path = yield* Effect.tryPromise({
        try: () => buildModel(name, dir ?? modelCacheDir()),
        catch: (error) =>
          new Error(`building ${name} failed: ${error instanceof Error ? error.message : String(error)}`)
      })
      yield* Console.log(`built ${name} in ${((performance.now() - started) / 1000).toFixed(2)} s → ${path}`)
    }
  })

const megabytes = (bytes: number) => `${(bytes / 1e6).toFixed(1)} MB`

const bar = (fraction: number, width: number) => {
  const filled = Math.round(Math.min(1, Math.max(0, fraction)) * width)
  return `[${"#".repeat(filled)}${"-".repeat(width - filled)}]`
}

/**
 * Shows a download on standard error: on a terminal one line redrawn in place (the file, its bar,
 * the whole download's share), elsewhere a line per file as it is verified, for logs.
 */
const progressView = (stream: NodeJS.WriteStream) => {
  const redraw = stream.isTTY === true
  let lastDraw = 0
  const clear = () => (redraw ? "\r\x1b[K" : "")
  return (event: ModelDownloadEvent) => {
    switch (event._tag) {
      case "Waiting":
        stream.write(`${clear()}waiting for process ${event.pid}, which is downloading ${event.id}\n`)
        return
      case "Fetching":
        stream.write(
          `${clear()}${event.id}: fetching ${event.files} file(s), ${megabytes(event.bytes)}, ` +
            `dtype ${event.dtype}, commit ${event.commit.slice(0, 12)}\n`
        )
        return
      case "Progress": {
        const now = Date.now()
        if (!redraw || (now - lastDraw < 100 && event.bytes !== event.total)) return
        lastDraw = now
        const file =
          event.total === undefined ? megabytes(event.bytes) : `${megabytes(event.bytes)}/${megabytes(event.total)}`
        const overall = event.overallTotal > 0 ? event.overallBytes / event.overallTotal : 0
        stream.write(
          `\r\x1b[K${event.file} ${bar(event.total ? event.bytes / event.total : 0, 24)} ${file}` +
            `  total ${(overall * 100).toFixed(0)}%`
        )
        return
      }
      case "Verified":
        stream.write(
          `${clear()}  ${event.file} (${event.check === "size" ? "size checked" : `${event.check} verified`})\n`
        )
        return
    }
  }
}

/** `cornserve models pull ID [--dtype D] [--offline] [--dir DIR]`: prints the model's directory. */
export const pullModel = (
  id: string,
  options: { dtype: Dtype | undefined; offline: boolean; dir: string | undefined }
) =>
  Effect.gen(function* () {
    if (builtinModelNames.includes(id) || benchModelNames.includes(id)) {
      return yield* new CliFailure({ message: `${id} is a built-in model: build it with cornserve models build ${id}` })
    }
    const misspelt = unknownBuiltin(id)
    if (misspelt !== undefined) return yield* new CliFailure({ message: misspelt.message })
    const ref = parseHubId(id)
    if (ref === undefined) {
      return yield* new CliFailure({
        message: `"${id}" is not a hub model id: write it as org/name or org/name@revision`
      })
    }
    const dir = yield* Effect.tryPromise({
      try: () =>
        resolveHubModel(id, ref, options.dir ?? modelCacheDir(), {
          dtype: options.dtype,
          offline: options.offline,
          refresh: true,
          onEvent: progressView(process.stderr)
        }),
      catch: (error) => new CliFailure({ message: error instanceof Error ? error.message : String(error) })
    })
    yield* Console.log(dir)
  })
