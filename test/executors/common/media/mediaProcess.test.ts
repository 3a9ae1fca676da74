import { spawn } from "node:child_process"
import { mkdtemp, readdir, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { decodeVideoFrames } from "../../../../src/executors/common/media/MediaDecoder.js"
import { mediaProcessBounds } from "../../../../src/executors/common/media/MediaLimits.js"
import { runBounded, withScratchDirectory } from "../../../../src/executors/common/media/MediaProcess.js"
import { runAsJob } from "../../../../src/executors/common/ThreadJob.js"
import { videoTools } from "../../../../src/executors/common/media/VideoContainer.js"
import { builtModuleUrl } from "../../../support/builtModules.js"
import { eventually, isAlive } from "../../../support/platform.js"
import { ffmpegFile } from "../../../support/videos.js"

/**
 * The children that decode media, as a preprocessing thread runs them: one at a time, each in its
 * own process group, with an address-space bound and the out-of-memory killer's first place, ended
 * with its job, with the process that started it (run from dist/) and at its deadline; and a
 * decode's temporary files in the job's scratch directory.
 */

const bounds = { timeoutMs: 10_000, maxStdoutBytes: 1024 * 1024 }

/** Runs a shell script as a media child, and gives what it wrote. */
const shell = async (script: string, options: { readonly timeoutMs?: number } = {}) => {
  let output = ""
  await runBounded("sh", ["-c", script], { ...bounds, ...options }, (chunk) => {
    output += chunk.toString()
  })
  return output
}

const job = (signal: AbortSignal, scratchDir?: string) => ({ signal, scratchDir })

describe("media decoders' child processes", () => {
  let scratch: string
  beforeAll(async () => {
    scratch = await mkdtemp(join(tmpdir(), "cornserve-test-scratch-"))
  })
  afterAll(() => rm(scratch, { recursive: true, force: true }))

  it("run in a process group of their own, with an address-space bound and the OOM killer's first place", async () => {
    const lines = (
      await shell(
        `echo $$; cut -d" " -f5 /proc/$$/stat; grep "Max address space" /proc/$$/limits; cat /proc/$$/oom_score_adj`
      )
    )
      .trim()
      .split("\n")
    const [pid, group, limit, oomScoreAdj] = lines
    expect(group).toBe(pid)
    expect(limit!.split(/\s+/).slice(3, 5)).toEqual([
      String(mediaProcessBounds.addressSpaceBytes),
      String(mediaProcessBounds.addressSpaceBytes)
    ])
    expect(oomScoreAdj).toBe("1000")
  })

  it("take turns: a thread runs one at a time, the others wait", async () => {
    let running = 0
    let most = 0
    const run = () =>
      runBounded("sh", ["-c", "echo started; sleep 0.2"], bounds, () => {
        running++
        most = Math.max(most, running)
      }).then(() => running--)
    await Promise.all([run(), run(), run()])
    expect(most).toBe(mediaProcessBounds.perThread)
  })

  it("end with their job: the child and what it started are gone, and a child still waiting for its turn never starts", async () => {
    const cancel = new AbortController()
    let grandchild: number | undefined
    const running = runAsJob(job(cancel.signal), () =>
      runBounded("sh", ["-c", "sleep 30 & echo $!; wait"], bounds, (chunk) => {
        grandchild = Number(chunk.toString().trim())
      })
    )
    const waitingCancel = new AbortController()
    let waitingStarted = false
    const waiting = runAsJob(job(waitingCancel.signal), () =>
      runBounded("sh", ["-c", "echo started"], bounds, () => {
        waitingStarted = true
      })
    )
    while (grandchild === undefined) await new Promise((resolve) => setTimeout(resolve, 20))
    waitingCancel.abort(new Error("its request ended"))
    await expect(waiting).rejects.toThrow("its request ended")
    const cancelledAt = Date.now()
    cancel.abort(new Error("the request ended"))
    await expect(running).rejects.toThrow("the request ended")
    expect(Date.now() - cancelledAt).toBeLessThan(2_000)
    while (isAlive(grandchild) && Date.now() - cancelledAt < 2_000)
      await new Promise((resolve) => setTimeout(resolve, 20))
    expect(isAlive(grandchild)).toBe(false)
    expect(waitingStarted).toBe(false)
  })

  it("die with the process that started them, however it ends, even one that writes nothing", async () => {
    const script = `import { runBounded } from ${JSON.stringify(builtModuleUrl("src/executors/common/media/MediaProcess.ts"))}
runBounded("sh", ["-c", "echo $$; exec sleep 60"], { timeoutMs: 120000, maxStdoutBytes: 100 }, (chunk) => process.stdout.write(chunk))`
    const parent = spawn(process.execPath, ["--input-type=module", "-e", script], {
      stdio: ["ignore", "pipe", "inherit"]
    })
    const pid = await new Promise<number>((resolve) =>
      parent.stdout.once("data", (chunk: Buffer) => resolve(Number(chunk.toString().trim())))
    )
    expect(isAlive(pid)).toBe(true)
    parent.kill("SIGKILL")
    await eventually(async () => (isAlive(pid) ? undefined : true), 2_000)
  })

  it("are killed at their deadline", async () => {
    const started = Date.now()
    await expect(shell("sleep 30", { timeoutMs: 300 })).rejects.toMatchObject({
      _tag: "MediaError",
      message: "decoding the video took longer than 300 ms"
    })
    expect(Date.now() - started).toBeLessThan(5_000)
  })

  it("keep a decode's files in the job's scratch directory, removed whether the decode succeeds or fails", async () => {
    const cancel = new AbortController()
    const used = await runAsJob(job(cancel.signal, scratch), () =>
      withScratchDirectory("video", async (directory) => directory)
    )
    expect(dirname(used)).toBe(scratch)
    await expect(
      runAsJob(job(cancel.signal, scratch), () =>
        withScratchDirectory("audio", async () => {
          throw new Error("undecodable")
        })
      )
    ).rejects.toThrow("undecodable")
    expect(await readdir(scratch)).toEqual([])
  })

  it("decode 4K frames; refuse 8192×8192 from the header, and stop a decoder that reaches its bound anyway", async () => {
    const uhd = await ffmpegFile(
      ["-f", "lavfi", "-i", "testsrc=s=3840x2160:r=2", "-frames:v", "2", "-c:v", "libx264", "-preset", "ultrafast"],
      "mp4"
    )
    const frames = await decodeVideoFrames(uhd, { width: 64, height: 36, kernel: "linear" }, 2)
    expect(frames).toHaveLength(2)
    const huge = await ffmpegFile(
      ["-f", "lavfi", "-i", "color=c=red:s=8192x8192:r=2", "-frames:v", "2", "-c:v", "libx264", "-preset", "ultrafast"],
      "mp4"
    )
    await expect(decodeVideoFrames(huge, { width: 64, height: 64, kernel: "linear" }, 2)).rejects.toMatchObject({
      _tag: "MediaTooLarge",
      message:
        "the video's frames are 8192×8192: decoding them takes about 1376 MiB, more memory than the 1024 MiB one decoder may take"
    })
    // A header that understates its frames (a stream may change size midway) gets as far as the decoder's bound.
    const path = join(scratch, "huge.mp4")
    await writeFile(path, huge)
    await expect(
      runBounded(
        videoTools().ffmpeg,
        ["-v", "error", "-threads", "2", "-i", path, "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"],
        { timeoutMs: 120_000, maxStdoutBytes: 2 * 8192 * 8192 * 3 },
        () => undefined
      )
    ).rejects.toMatchObject({
      _tag: "MediaTooLarge",
      message: "decoding the video takes more memory than the 1024 MiB one decoder may take"
    })
    await rm(path)
  }, 240_000)
})
