import { type ChildProcess, spawn } from "node:child_process"
import { EventEmitter } from "node:events"
import { readFileSync } from "node:fs"
import { constants } from "node:os"
import * as Either from "effect/Either"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import type { Socket } from "node:net"
import {
  appMessageLimitBytes,
  encodeFrame,
  FrameReader,
  FromApp,
  type ToAppProcess,
  type ToApp
} from "../../app-runtime/driver/protocol.js"
import { AppLog } from "./AppLog.js"
import { ChannelBudget, channelRateExceeded, channelRateOf } from "./ChannelBudget.js"
import { appSandbox } from "./AppSandbox.js"
import { OutboundProxy, type OutboundRules } from "./OutboundProxy.js"

export interface AppProcessLimits {
  /** V8's old-generation heap limit, in MiB (`--max-old-space-size`). */
  readonly heapMiB: number
  /** The whole process's resident memory, off-heap buffers included; past it the process is killed. */
  readonly rssMiB: number
  /** The largest answer (or streamed line) the app may send, in bytes of JSON; checked before it is sent. */
  readonly maxResponseBytes: number
}

/** Compiled once: every message an app's process sends goes through it. */
const decodeFromWorker = Schema.decodeUnknownEither(FromApp)

/** How long a process whose channel failed has to exit on its own, with its own exit code, before it is stopped. */
const channelFailureGraceMs = 1_000

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
 * Around it, the operating system's boundary (AppSandbox.ts): a network namespace with no network,
 * and a user of its own where the platform runs as root. Its stdout and stderr are pipes this
 * process reads into the app's log (AppLog.ts), bounded and marked as the app's; it holds no fd of
 * the platform's but those pipes and its channel.
 *
 * Its channel is a pipe on its fd 3 carrying length-prefixed frames (protocol.ts), not Node's IPC
 * channel: Node parses an IPC channel's JSON in this process without a bound on a message's size,
 * throws here on a line that is not JSON, and acts on its own messages (`{ cmd: "NODE_..." }`) before
 * any decoder sees them; an app's code can write to the fd whatever the SDK does. Here every frame is
 * refused by its length before it is buffered, then parsed and decoded, and a bad one stops the app.
 * Its bytes are counted as they arrive against the app's rate (ChannelBudget.ts): a process that
 * writes faster is stopped before what it wrote is buffered any further.
 *
 * It has the shape of a worker thread (`postMessage`, `message`/`error`/`exit` events, `terminate`),
 * so the app driver runs it as it ran one.
 */
export class AppProcess extends EventEmitter<{
  message: [FromApp]
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
  private readonly log: AppLog
  /** The proxy to the hosts the app's registration allows; none when it allows none. */
  private readonly outbound: OutboundProxy | undefined
  /** What the app may still write to its channel. */
  private readonly budget: ChannelBudget

  /**
   * `log` is the app's, kept across its processes; without one, the process has a log of its own,
   * named by its pid. `outbound` names the hosts the app may connect to (OutboundProxy.ts). `budget`
   * is the app's, kept across its processes; without one, the process has one of its own.
   */
  constructor(code: string, limits: AppProcessLimits, log?: AppLog, outbound?: OutboundRules, budget?: ChannelBudget) {
    super()
    this.budget = budget ?? new ChannelBudget(channelRateOf(limits.maxResponseBytes))
    const sandbox = appSandbox()
    const { runtime } = sandbox
    const launch = sandbox.launch([
      "--experimental-permission",
      ...[...runtime.readableDirs, ...runtime.readableLinks].map((path) => `--allow-fs-read=${path}`),
      `--max-old-space-size=${limits.heapMiB}`,
      "--no-warnings=ExperimentalWarning",
      runtime.hostEntry
    ])
    this.outbound =
      outbound === undefined || outbound.hosts.length === 0
        ? undefined
        : new OutboundProxy(outbound, launch.runsAs, (line) => this.log.note(line))
    this.child = spawn(launch.command, launch.args, {
      env: {
        NODE_ENV: process.env.NODE_ENV ?? "production",
        ...(this.outbound === undefined ? {} : { CORNSERVE_OUTBOUND_SOCKET: this.outbound.path })
      },
      // A directory every user may enter: the platform's own may be closed to the app's user.
      cwd: "/",
      stdio: ["ignore", "pipe", "pipe", "pipe"],
      ...(launch.user === undefined ? {} : { uid: launch.user.uid, gid: launch.user.gid })
    })
    this.log = log ?? new AppLog(`process ${this.child.pid ?? "(not started)"}`)
    for (const stream of [this.child.stdout!, this.child.stderr!]) {
      const reader = this.log.reader()
      stream.on("data", (chunk: Buffer) => reader.write(chunk))
      stream.once("end", () => reader.end())
      stream.on("error", () => undefined)
    }
    this.channel = this.child.stdio[3] as Socket
    const maxMessageBytes = appMessageLimitBytes(limits.maxResponseBytes)
    const frames = new FrameReader(maxMessageBytes)
    const receive = (message: unknown) => this.receive(message)
    this.channel.on("data", (chunk: Buffer) => {
      if (this.stopped || this.exited) return
      if (!this.budget.spend(chunk.length)) return this.stop(channelRateExceeded(this.budget.rate))
      const broken = frames.read(chunk, receive)
      if (broken !== undefined) this.stop(`the app's process broke the protocol with ${broken}`)
    })
    // The pipe fails or closes when the process goes, and its error may come before the exit that
    // says what happened (an exit code): a process still there a moment later is stopped for it.
    this.channel.on("error", () => {
      const grace = setTimeout(() => this.stop("the app's channel failed"), channelFailureGraceMs)
      grace.unref()
      void this.exitedPromise.then(() => clearTimeout(grace))
    })
    this.child.on("error", (error) => {
      // A process that could not be started never exits: its proxy goes now.
      if (this.child.pid === undefined) this.outbound?.close()
      this.emit("error", error)
    })
    this.exitedPromise = new Promise((resolve) =>
      this.child.once("exit", (code, signal) => {
        this.exited = true
        clearInterval(this.memoryCheck)
        this.outbound?.close()
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
    this.post({
      t: "load",
      code: runtime.relocate(code),
      maxResponseBytes: limits.maxResponseBytes,
      maxMessageBytes
    })
  }

  get pid(): number | undefined {
    return this.child.pid
  }

  /** Whether it broke a rule or exited: nothing more it sent is acted on. */
  get stopping(): boolean {
    return this.stopped || this.exited
  }

  /** The last lines the app wrote to its stdout and stderr (its log's, across its processes). */
  logTail(): string {
    return this.log.tail()
  }

  postMessage(message: ToApp): void {
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
    const frame = encodeFrame(message)
    this.budget.credit(frame.length)
    this.channel.write(frame)
  }
}

const signalNumber = (signal: NodeJS.Signals): number => constants.signals[signal] ?? 0
