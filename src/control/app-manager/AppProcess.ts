import { type ChildProcess, fork } from "node:child_process"
import { EventEmitter } from "node:events"
import { existsSync, readFileSync, realpathSync } from "node:fs"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import { createRequire } from "node:module"
import { constants } from "node:os"
import { Either, ParseResult, Schema } from "effect"
import { FromWorker, type ToAppProcess, type ToWorker } from "../../app-runtime/driver/protocol.js"

const hostEntry = realpathSync(fileURLToPath(new URL("../../app-runtime/driver/worker.js", import.meta.url)))
const appRuntimeDir = fileURLToPath(new URL("../../app-runtime/", import.meta.url))

export interface AppProcessLimits {
  /** V8's old-generation heap limit, in MiB (`--max-old-space-size`). */
  readonly heapMiB: number
  /** The whole process's resident memory, off-heap buffers included; past it the process is killed. */
  readonly rssMiB: number
  /** The largest answer (or streamed line) the app may send, in bytes of JSON; checked before it is sent. */
  readonly maxResponseBytes: number
}

/**
 * The directories an app's process may read: the SDK (the app runtime) and the packages it and the
 * app import (`effect` and what `effect` depends on). Nothing else: not the state directory, not the
 * platform's configuration, not the rest of the file system.
 */
let readable: ReadonlyArray<string> | undefined
const readablePaths = (): ReadonlyArray<string> => {
  // Real paths: the permission model checks the files the loader opens, after links are resolved.
  readable ??= [
    appRuntimeDir,
    ...packageClosure(dirname(createRequire(import.meta.url).resolve("effect/package.json")))
  ].map((dir) => `${realpathSync(dir)}/`)
  return readable
}

/** A package's directory and those of everything it depends on, found where Node would find them. */
const packageClosure = (packageDir: string): ReadonlyArray<string> => {
  const found = new Set<string>()
  const visit = (dir: string) => {
    if (found.has(dir) || !existsSync(join(dir, "package.json"))) return
    found.add(dir)
    const manifest = JSON.parse(readFileSync(join(dir, "package.json"), "utf8")) as {
      readonly dependencies?: Readonly<Record<string, string>>
    }
    for (const name of Object.keys(manifest.dependencies ?? {})) {
      // Node's lookup: the node_modules of the dependent's directory, then of each directory above it.
      for (let ancestor = dir; ; ancestor = dirname(ancestor)) {
        const candidate = join(ancestor, "node_modules", name)
        if (existsSync(candidate)) {
          visit(candidate)
          break
        }
        if (dirname(ancestor) === ancestor) break
      }
    }
  }
  visit(packageDir)
  return [...found]
}

/** Compiled once: every message an app's process sends goes through it. */
const decodeFromWorker = Schema.decodeUnknownEither(FromWorker)

/** How often the resident memory of an app's process is read. */
const memoryCheckPeriodMs = 200
const pageBytes = 4096

const residentBytes = (pid: number): number | undefined => {
  try {
    const [, resident] = readFileSync(`/proc/${pid}/statm`, "utf8").split(" ")
    return Number(resident) * pageBytes
  } catch {
    return undefined
  }
}

/**
 * One app's code, running in a child process of its own under Node's permission model: it may read
 * only the SDK and its packages, and may not write files, start processes or threads, or load native
 * addons. Its environment carries no platform secret, its heap and resident memory are capped, and
 * whatever it does (exit, kill itself, crash, run out of memory) ends this process only.
 *
 * It has the shape of a worker thread (`postMessage`, `message`/`error`/`exit` events, `terminate`),
 * so the app driver runs it as it ran one.
 */
export class AppProcess extends EventEmitter<{
  message: [FromWorker]
  error: [Error]
  exit: [number]
}> {
  private readonly child: ChildProcess
  private readonly memoryCheck: NodeJS.Timeout
  private exited = false
  private readonly exitedPromise: Promise<void>

  constructor(code: string, limits: AppProcessLimits) {
    super()
    const readable = readablePaths().map((path) => `--allow-fs-read=${path}`)
    this.child = fork(hostEntry, [], {
      execArgv: [
        "--experimental-permission",
        ...readable,
        `--allow-fs-read=${hostEntry}`,
        `--max-old-space-size=${limits.heapMiB}`,
        "--no-warnings=ExperimentalWarning"
      ],
      env: { NODE_ENV: process.env.NODE_ENV ?? "production" },
      serialization: "json",
      stdio: ["ignore", "inherit", "inherit", "ipc"]
    })
    this.child.on("message", (message: unknown) => this.receive(message))
    this.child.on("error", (error) => this.emit("error", error))
    this.exitedPromise = new Promise((resolve) =>
      this.child.once("exit", (code, signal) => {
        this.exited = true
        clearInterval(this.memoryCheck)
        resolve()
        this.emit("exit", code ?? (signal === null ? 1 : 128 + signalNumber(signal)))
      })
    )
    this.memoryCheck = setInterval(() => {
      const pid = this.child.pid
      const resident = pid === undefined ? undefined : residentBytes(pid)
      if (resident !== undefined && resident > limits.rssMiB * 1024 * 1024) {
        this.emit(
          "error",
          new Error(
            `the app's process used ${Math.round(resident / 1048576)} MiB, over its limit of ${limits.rssMiB} MiB`
          )
        )
        this.child.kill("SIGKILL")
      }
    }, memoryCheckPeriodMs)
    this.memoryCheck.unref()
    this.post({ t: "load", code, maxResponseBytes: limits.maxResponseBytes })
  }

  get pid(): number | undefined {
    return this.child.pid
  }

  postMessage(message: ToWorker): void {
    this.post(message)
  }

  /** Kills the process and resolves once it is gone. */
  async terminate(): Promise<void> {
    if (!this.exited) this.child.kill("SIGKILL")
    await this.exitedPromise
  }

  /**
   * A message that is not one of the protocol's breaks it: only an app that replaced the SDK's
   * sending code sends one, and whatever it meant cannot be acted on. The process is failed and
   * killed, as one over its memory limit is; its exit fails the requests it held and restarts it.
   */
  private receive(message: unknown) {
    const decoded = decodeFromWorker(message)
    if (Either.isRight(decoded)) return void this.emit("message", decoded.right)
    if (this.exited) return
    // Cut short: the issue quotes the message, which may be as large as the app likes.
    const issue = ParseResult.TreeFormatter.formatErrorSync(decoded.left).slice(0, 1_000)
    this.emit(
      "error",
      new Error(`the app's process broke the protocol with a message the platform cannot read: ${issue}`)
    )
    this.child.kill("SIGKILL")
  }

  private post(message: ToAppProcess) {
    if (this.exited || !this.child.connected) return
    this.child.send(message, (error) => {
      // A process that is going away cannot take messages; its exit fails what it held.
      if (error !== null && error !== undefined && !this.exited) this.child.kill("SIGKILL")
    })
  }
}

const signalNumber = (signal: NodeJS.Signals): number => constants.signals[signal] ?? 0
