/**
 * The ffmpeg and ffprobe children that decode media (VideoContainer.ts, AudioContainer.ts), each
 * bounded whatever its input:
 * - in number: a thread runs `mediaProcessBounds.perThread` at once, the others wait their turn;
 * - in memory: an address-space bound set by `prlimit` (util-linux), past which its allocations
 *   fail and it stops (MediaTooLarge), and the out-of-memory killer's first choice
 *   (`oom_score_adj` 1000, set by `choom` before it starts), before the executor and the platform;
 * - in time: killed at its deadline, when it writes more than its bound, and when its job is
 *   cancelled (its request ended: ThreadJob.ts), in its own process group;
 * - in lifetime: `setpriv --pdeathsig KILL` has the kernel kill it when the thread that started it
 *   ends, so it outlives neither its preprocessing thread nor the router, however they end.
 * Without util-linux's `setpriv`, `prlimit` and `choom` a child runs with the rest of these bounds
 * only (its score raised once it runs).
 *
 * A decode's temporary files go in a directory of their own under the job's scratch directory (the
 * executor's run directory, which the router empties when it starts), removed on every path.
 */
import { spawn } from "node:child_process"
import { accessSync, constants } from "node:fs"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { maxOomScoreAdj, raiseOomScoreAdj } from "../../../process/OomScore.js"
import { abortReason, currentJob } from "../ThreadJob.js"
import { DecoderSlots } from "./DecoderSlots.js"
import { MediaError, MediaTooLarge } from "./errors.js"
import { mediaProcessBounds } from "./MediaLimits.js"

/** What one bounded run of ffmpeg or ffprobe may take, and what it decodes (for its errors). */
export interface RunBounds {
  readonly timeoutMs: number
  readonly maxStdoutBytes: number
  readonly what?: "video" | "audio"
}

/** The end of what a run wrote to stderr: ffmpeg's reason comes last. */
const maxStderrBytes = 8 * 1024

export const mebibytes = (bytes: number) => Math.round(bytes / 1024 / 1024)

/** This thread's turns: a router's threads each have their own, so an executor runs threads × perThread. */
const slots = new DecoderSlots(mediaProcessBounds.perThread)

interface Confinement {
  readonly setpriv: string
  readonly prlimit: string
  readonly choom: string
}

const findTool = (name: string): string | undefined => {
  const directories = [...(process.env.PATH ?? "").split(":"), "/usr/bin", "/bin", "/usr/sbin", "/sbin"]
  for (const directory of directories) {
    if (directory === "") continue
    const path = join(directory, name)
    try {
      accessSync(path, constants.X_OK)
      return path
    } catch {
      // Not in this directory.
    }
  }
  return undefined
}

let confinement: Confinement | null | undefined

/** util-linux's tools that bound a child, found once; null where they are not installed. */
const confinementTools = (): Confinement | null => {
  if (confinement !== undefined) return confinement
  const setpriv = findTool("setpriv")
  const prlimit = findTool("prlimit")
  const choom = findTool("choom")
  confinement =
    setpriv === undefined || prlimit === undefined || choom === undefined ? null : { setpriv, prlimit, choom }
  if (confinement === null) {
    console.error(
      "cornserve: setpriv, prlimit and choom (util-linux) are not installed: media decoders run without a memory bound and could outlive an executor that is killed"
    )
  }
  return confinement
}

/** The command that runs `binary` with `args` inside its bounds, and whether the bounds are the kernel's. */
const boundedCommand = (binary: string, args: ReadonlyArray<string>) => {
  const tools = confinementTools()
  if (tools === null) return { file: binary, args: [...args], confined: false }
  return {
    file: tools.setpriv,
    args: [
      "--pdeathsig",
      "KILL",
      "--",
      tools.prlimit,
      `--as=${mediaProcessBounds.addressSpaceBytes}`,
      "--core=0",
      "--",
      tools.choom,
      "-n",
      String(maxOomScoreAdj),
      "--",
      binary,
      ...args
    ],
    confined: true
  }
}

/** What ffmpeg and ffprobe say, or how they end, when an allocation fails. */
const outOfMemory = (stderr: string, signal: NodeJS.Signals | null) =>
  signal === "SIGSEGV" ||
  signal === "SIGABRT" ||
  signal === "SIGBUS" ||
  /cannot allocate memory|failed to allocate|out of memory/i.test(stderr)

const unavailable = (binary: string, what: string, reason: string) =>
  new MediaError({
    message: `${what} decoding is not available: cannot run ${binary} (${reason}); install ffmpeg or set CORNSERVE_FFMPEG and CORNSERVE_FFPROBE`
  })

/** Ends the child's process group; the group is gone already when the child was its last member. */
const killGroup = (pid: number | undefined) => {
  if (pid === undefined) return
  try {
    process.kill(-pid, "SIGKILL")
  } catch {
    // Gone already.
  }
}

/**
 * Runs a binary with no stdin, the PATH its only environment (it needs none of the executor's
 * secrets), stdout handed to `onStdout` chunk by chunk (which may throw to stop it), stderr kept
 * to its end; within the bounds above, once this thread has a turn for it. Killed when it runs
 * past its time, writes past its bound, or its job is cancelled (rejecting with the job's reason).
 */
export const runBounded = async (
  binary: string,
  args: ReadonlyArray<string>,
  bounds: RunBounds,
  onStdout: (chunk: Buffer) => void
): Promise<{ readonly code: number | null; readonly stderr: string }> => {
  const signal = currentJob()?.signal
  const giveBack = await slots.take(signal)
  try {
    return await runChild(binary, args, bounds, onStdout, signal)
  } finally {
    giveBack()
  }
}

const runChild = (
  binary: string,
  args: ReadonlyArray<string>,
  bounds: RunBounds,
  onStdout: (chunk: Buffer) => void,
  signal: AbortSignal | undefined
): Promise<{ readonly code: number | null; readonly stderr: string }> =>
  new Promise((resolve, reject) => {
    const what = bounds.what ?? "video"
    if (signal?.aborted) return reject(abortReason(signal))
    const command = boundedCommand(binary, args)
    // A group of its own (setsid): killing the group ends anything it started, too.
    const child = spawn(command.file, command.args, {
      stdio: ["ignore", "pipe", "pipe"],
      env: { PATH: process.env.PATH ?? "" },
      detached: true
    })
    // Unconfined, the score is raised once it runs (choom raises it before the binary starts).
    if (!command.confined && child.pid !== undefined) raiseOomScoreAdj(child.pid, maxOomScoreAdj)
    let stderr = ""
    let written = 0
    let failure: Error | undefined
    // Once it has exited its pid may be another process's: its group is not killed after that.
    let exited = false
    child.once("exit", () => {
      exited = true
    })
    const stop = (error: Error) => {
      failure ??= error
      if (!exited) killGroup(child.pid)
    }
    const onAbort = () => stop(abortReason(signal!))
    signal?.addEventListener("abort", onAbort, { once: true })
    const timer = setTimeout(
      () => stop(new MediaError({ message: `decoding the ${what} took longer than ${bounds.timeoutMs} ms` })),
      bounds.timeoutMs
    )
    const settled = () => {
      clearTimeout(timer)
      signal?.removeEventListener("abort", onAbort)
    }
    child.stdout.on("data", (chunk: Buffer) => {
      if (failure !== undefined) return
      written += chunk.length
      if (written > bounds.maxStdoutBytes) {
        return stop(new MediaError({ message: `the ${what} decoded to more data than its header declares` }))
      }
      try {
        onStdout(chunk)
      } catch (error) {
        stop(error as Error)
      }
    })
    child.stderr.setEncoding("utf8")
    child.stderr.on("data", (chunk: string) => {
      stderr = (stderr + chunk).slice(-maxStderrBytes)
    })
    child.once("error", (error) => {
      settled()
      reject(unavailable(binary, what, error.message))
    })
    child.once("close", (code, exitSignal) => {
      settled()
      if (failure !== undefined) return reject(failure)
      if (command.confined && code === 127 && /failed to execute/.test(stderr)) {
        return reject(unavailable(binary, what, stderr.trim().split(": ").at(-1) ?? "not found"))
      }
      if (command.confined && code !== 0 && outOfMemory(stderr, exitSignal)) {
        return reject(
          new MediaTooLarge({
            message: `decoding the ${what} takes more memory than the ${mebibytes(mediaProcessBounds.addressSpaceBytes)} MiB one decoder may take`
          })
        )
      }
      resolve({ code, stderr })
    })
  })

/**
 * Runs `use` with a new private directory for a decode's temporary files (`what`-…), under the
 * job's scratch directory or, outside a job, the system's; removed once `use` settles, however.
 */
export const withScratchDirectory = async <A>(
  what: "video" | "audio",
  use: (directory: string) => Promise<A>
): Promise<A> => {
  const scratchDir = currentJob()?.scratchDir
  const directory = await mkdtemp(
    scratchDir === undefined ? join(tmpdir(), `cornserve-${what}-`) : join(scratchDir, `${what}-`)
  )
  try {
    return await use(directory)
  } finally {
    await rm(directory, { recursive: true, force: true })
  }
}
