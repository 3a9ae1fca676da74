import { type ChildProcess, spawn } from "node:child_process"
import { EventEmitter } from "node:events"
import { existsSync, readFileSync, realpathSync } from "node:fs"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import { createRequire } from "node:module"
import { constants } from "node:os"
import { Either, ParseResult, Schema } from "effect"
import type { Socket } from "node:net"
import {
  appMessageLimitBytes,
  encodeFrame,
  FrameReader,
  FromWorker,
  type ToAppProcess,
  type ToWorker
} from "../../app-runtime/driver/protocol.js"

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
 * whatever it does (exit, kill itself, crash, run out of memory, write anything to its channel) ends
 * this process only.
 *
 * Its channel is a pipe on its fd 3 carrying length-prefixed frames (protocol.ts), not Node's IPC
 * channel: Node parses an IPC channel's JSON in this process without a bound on a message's size,
 * throws here on a line that is not JSON, and acts on its own messages (`{ cmd: "NODE_..." }`) before
 * any decoder sees them; an app's code can write to the fd whatever the SDK does. Here every frame is
 * refused by its length before it is buffered, then parsed and decoded, and a bad one stops the app.
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
  private readonly channel: Socket
  private readonly memoryCheck: NodeJS.Timeout
  private exited = false
  /** Set once the process broke a rule: it is being killed, and nothing more it sent is acted on. */
  private stopped = false
  private readonly exitedPromise: Promise<void>

  constructor(code: string, limits: AppProcessLimits) {
    super()
    const readable = readablePaths().map((path) => `--allow-fs-read=${path}`)
    this.child = spawn(
      process.execPath,
      [
        "--experimental-permission",
        ...readable,
        `--allow-fs-read=${hostEntry}`,
        `--max-old-space-size=${limits.heapMiB}`,
        "--no-warnings=ExperimentalWarning",
        hostEntry
      ],
      {
        env: { NODE_ENV: process.env.NODE_ENV ?? "production" },
        stdio: ["ignore", "inherit", "inherit", "pipe"]
      }
    )
    this.channel = this.child.stdio[3] as Socket
    const maxMessageBytes = appMessageLimitBytes(limits.maxResponseBytes)
    const frames = new FrameReader(maxMessageBytes)
    const receive = (message: unknown) => this.receive(message)
    this.channel.on("data", (chunk: Buffer) => {
      if (this.stopped || this.exited) return
      const broken = frames.read(chunk, receive)
      if (broken !== undefined) this.stop(`the app's process broke the protocol with ${broken}`)
    })
    // The pipe fails or closes when the process goes; its exit says what happened.
    this.channel.on("error", () => this.stop("the app's channel failed"))
    this.child.on("error", (error) => this.emit("error", error))
    this.exitedPromise = new Promise((resolve) =>
      this.child.once("exit", (code, signal) => {
        this.exited = true
        clearInterval(this.memoryCheck)
        this.channel.destroy()
        resolve()
        this.emit("exit", code ?? (signal === null ? 1 : 128 + signalNumber(signal)))
      })
    )
    this.memoryCheck = setInterval(() => {
      const pid = this.child.pid
      const resident = pid === undefined ? undefined : residentBytes(pid)
      if (resident !== undefined && resident > limits.rssMiB * 1024 * 1024) {
        this.stop(
          `the app's process used ${Math.round(resident / 1048576)} MiB, over its limit of ${limits.rssMiB} MiB`
        )
      }
    }, memoryCheckPeriodMs)
    this.memoryCheck.unref()
    this.post({ t: "load", code, maxResponseBytes: limits.maxResponseBytes, maxMessageBytes })
  }

  get pid(): number | undefined {
    return this.child.pid
  }

  postMessage(message: ToWorker): void {
    this.post(message)
  }

  /** Kills the process and resolves once it is gone. */
  async terminate(): Promise<void> {
    this.stopped = true
    if (!this.exited) this.child.kill("SIGKILL")
    await this.exitedPromise
  }

  /**
   * The process broke a rule (its memory, the protocol): it is failed with `reason` and killed; its
   * exit fails the requests it held and restarts it. Whatever it sends from now on is dropped.
   */
  stop(reason: string): void {
    if (this.stopped || this.exited) return
    this.stopped = true
    this.emit("error", new Error(reason))
    this.child.kill("SIGKILL")
  }

  /**
   * A message that is not one of the protocol's breaks it: only an app that replaced the SDK's
   * sending code sends one, and whatever it meant cannot be acted on.
   */
  private receive(message: unknown) {
    if (this.stopped || this.exited) return
    const decoded = decodeFromWorker(message)
    if (Either.isRight(decoded)) {
      try {
        this.emit("message", decoded.right)
      } catch (error) {
        // Whatever acting on a message throws ends this app's requests, not the platform.
        this.stop(`the platform could not act on a message of the app's process: ${String(error).slice(0, 1_000)}`)
      }
      return
    }
    // Cut short: the issue quotes the message, which may be as large as the app likes.
    const issue = ParseResult.TreeFormatter.formatErrorSync(decoded.left).slice(0, 1_000)
    this.stop(`the app's process broke the protocol with a message the platform cannot read: ${issue}`)
  }

  private post(message: ToAppProcess) {
    if (this.exited || this.stopped || !this.channel.writable) return
    // A process that is going away cannot take messages; its exit fails what it held.
    this.channel.write(encodeFrame(message))
  }
}

const signalNumber = (signal: NodeJS.Signals): number => constants.signals[signal] ?? 0
