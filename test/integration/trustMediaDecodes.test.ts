import { chmod, mkdtemp, readdir, rm, writeFile } from "node:fs/promises"
import { readdirSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { mediaProcessBounds } from "../../src/executors/common/media/MediaLimits.js"
import { executorOomScoreMargin, readOomScoreAdj } from "../../src/process/OomScore.js"
import { randomQwen2VLFiles } from "../../src/models/recipes/RandomQwen2VL.js"
import { writeModelFiles } from "../models/support/SmolVlmFixture.js"
import { mllmAppSource } from "../support/mllmApps.js"
import { appState, eventually, isAlive, type RunningPlatform, runCli, startPlatform } from "../support/platform.js"
import { trackPath } from "../support/reaper/registry.js"
import { ffmpegFile, rawInput } from "../support/videos.js"

/**
 * Media decodes through the real binary, where a request's videos go to Eric (a Qwen2-VL app with
 * encoder fission): sixteen tiny mp4s whose frames are 8192×8192 are refused without more than the
 * executor's decoders running at once, each within its memory bound, and nothing is left behind; a
 * client that hangs up, or a router killed outright, takes the decoders with it. The platform gets
 * a temporary directory of its own, where every temporary file of its decodes would be.
 */

/** The executor's preprocessing threads (`--preprocess-threads`' default), each with its turns. */
const preprocessThreads = 2
const maxDecoders = preprocessThreads * mediaProcessBounds.perThread

interface Decoder {
  readonly pid: number
  readonly parent: number
  readonly rssBytes: number
}

const statOf = (pid: string) => {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
  return stat.slice(stat.lastIndexOf(") ") + 2).split(" ")
}

/** The ffmpeg and ffprobe processes below `root` (the platform) now. */
const decodersBelow = (root: number): Array<Decoder> => {
  const children = new Map<number, Array<number>>()
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue
    try {
      const parent = Number(statOf(entry)[1])
      children.set(parent, [...(children.get(parent) ?? []), Number(entry)])
    } catch {
      // Gone meanwhile.
    }
  }
  const decoders: Array<Decoder> = []
  const below = [...(children.get(root) ?? [])]
  while (below.length > 0) {
    const pid = below.pop()!
    below.push(...(children.get(pid) ?? []))
    try {
      const comm = readFileSync(`/proc/${pid}/comm`, "utf8").trim()
      if (comm !== "ffmpeg" && comm !== "ffprobe") continue
      const [state, parent] = statOf(String(pid))
      if (state === "Z") continue
      const rss = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))
      decoders.push({ pid, parent: Number(parent), rssBytes: Number(rss?.[1] ?? 0) * 1024 })
    } catch {
      // Gone meanwhile.
    }
  }
  return decoders
}

const addressSpaceLimit = (pid: number): string | undefined => {
  try {
    return /Max address space\s+(\S+)/.exec(readFileSync(`/proc/${pid}/limits`, "utf8"))?.[1]
  } catch {
    return undefined
  }
}

/** What the platform's decoders did while it was watched: at most how many at once, their memory and OOM scores. */
const watchDecoders = (root: number) => {
  const seen = new Map<number, Decoder>()
  const limits = new Map<number, string>()
  const oomScoreAdjs = new Set<number | undefined>()
  let mostAtOnce = 0
  let mostRssBytes = 0
  const look = () => {
    const decoders = decodersBelow(root)
    mostAtOnce = Math.max(mostAtOnce, decoders.length)
    mostRssBytes = Math.max(
      mostRssBytes,
      decoders.reduce((sum, decoder) => sum + decoder.rssBytes, 0)
    )
    for (const decoder of decoders) {
      seen.set(decoder.pid, decoder)
      const limit = addressSpaceLimit(decoder.pid)
      if (limit !== undefined && !limits.has(decoder.pid)) limits.set(decoder.pid, limit)
      oomScoreAdjs.add(readOomScoreAdj(decoder.pid))
    }
  }
  const timer = setInterval(look, 50)
  return {
    seen: () => [...seen.values()],
    stop: () => {
      clearInterval(timer)
      return {
        mostAtOnce,
        mostRssBytes,
        limits: [...new Set(limits.values())],
        oomScoreAdjs: [...oomScoreAdjs].filter((score) => score !== undefined)
      }
    }
  }
}

/** Directories a decode keeps its files in, anywhere below `root`. */
const decodeDirsBelow = async (root: string): Promise<Array<string>> => {
  const found: Array<string> = []
  const walk = async (dir: string, depth: number) => {
    for (const entry of await readdir(dir, { withFileTypes: true }).catch(() => [])) {
      if (!entry.isDirectory()) continue
      if (/^(cornserve-)?(video|audio)-/.test(entry.name)) found.push(join(dir, entry.name))
      else if (depth < 4) await walk(join(dir, entry.name), depth + 1)
    }
  }
  await walk(root, 0)
  return found
}

const videoPart = (bytes: Buffer) => ({
  type: "video_url",
  video_url: { url: `data:video/mp4;base64,${bytes.toString("base64")}` }
})

describe("media decodes: bounded, cancelled with their request, supervised", () => {
  let root: string
  let model: string
  let platformTmp: string
  let platform: RunningPlatform
  /** Four 8192×8192 frames in 200 kB: decoding them takes more memory than a decoder may have. */
  let hostile: Buffer
  /**
   * 10 s of one colour in 4K UHD: a small file (the executor reads sixteen quickly) whose sampled
   * frames take seconds to decode to RGB, so that sixteen keep two decoders busy for a while.
   */
  let slow: Buffer

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-trust-media-"))
    platformTmp = await mkdtemp(join(tmpdir(), "cornserve-trust-media-tmp-"))
    trackPath(platformTmp)
    // The app's process, another user, reads the copy of the SDK the platform may make here.
    await chmod(platformTmp, 0o755)
    model = join(root, "qwen2-vl-tiny")
    await writeModelFiles(model, randomQwen2VLFiles({ seed: 5 }).files)
    ;[hostile, slow] = await Promise.all([
      ffmpegFile(
        [
          "-f",
          "lavfi",
          "-i",
          "color=c=red:s=8192x8192:r=2",
          "-frames:v",
          "4",
          "-c:v",
          "libx264",
          "-preset",
          "ultrafast"
        ],
        "mp4"
      ),
      ffmpegFile(
        ["-f", "lavfi", "-i", "color=c=blue:s=3840x2160:r=30", "-t", "10", "-c:v", "libx264", "-preset", "ultrafast"],
        "mp4"
      )
    ])
    platform = await startPlatform({
      args: ["--devices", "cpu:0,cpu:1", "--model-root", root],
      env: { TMPDIR: platformTmp }
    })
    const app = join(root, "videos.ts")
    await writeFile(app, mllmAppSource(model, ["image", "video"], true))
    const registered = await runCli(["app", "register", app], { CORNSERVE_GATEWAY_URL: platform.url })
    expect(registered.code, registered.stderr).toBe(0)
    await eventually(async () => ((await appState(platform.url, "videos")) === "ready" ? true : undefined), 120_000)
  }, 300_000)

  afterAll(async () => {
    await platform?.stop()
    await rm(root, { recursive: true, force: true })
    await rm(platformTmp, { recursive: true, force: true })
  })

  const ask = (videos: ReadonlyArray<Buffer>, signal?: AbortSignal) =>
    fetch(`${platform.url}/app/videos/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model,
        messages: [
          { role: "user", content: [...videos.map(videoPart), { type: "text", text: "What happens in these?" }] }
        ],
        max_tokens: 2
      }),
      ...(signal === undefined ? {} : { signal })
    })

  /** Resolves once no decoder of the platform runs and no decode's directory is left (or fails after `timeoutMs`). */
  const allGone = (timeoutMs: number) =>
    eventually(
      async () =>
        decodersBelow(platform.process.pid!).length === 0 && (await decodeDirsBelow(platformTmp)).length === 0
          ? true
          : undefined,
      timeoutMs
    )

  /** A small video of one grey, a new one each time (an encoder's answer to the same bytes may come from a cache). */
  let greys = 0
  const tinyVideo = () =>
    ffmpegFile(
      [...rawInput(56, 42, 4), "-c:v", "libx264", "-pix_fmt", "yuv444p", "-qp", "0"],
      "mp4",
      Buffer.alloc(8 * 56 * 42 * 3, 40 + 10 * greys++)
    )

  /** The platform answers a small video as before. */
  const stillAnswers = async () => {
    const answered = await ask([await tinyVideo()])
    expect(answered.status, await answered.clone().text()).toBe(200)
    const body = (await answered.json()) as { choices: Array<{ message: { content: string } }> }
    expect(body.choices[0]!.message.content.length).toBeGreaterThan(0)
  }

  it("refuses sixteen mp4s of 8192×8192 frames with at most two decoders at once, each in its bound, leaving none", async () => {
    expect(hostile.length).toBeLessThan(250_000)
    const watch = watchDecoders(platform.process.pid!)
    const answered = await ask(Array.from({ length: 16 }, () => hostile))
    const answer = await answered.text()
    // The encoder's refusal (MediaTooLarge), as OpenAI's clients know a refused input.
    expect(answered.status, answer).toBe(400)
    expect(answer).toMatch(
      /8192×8192: decoding them takes about 1376 MiB, more memory than the 1024 MiB one decoder may take/
    )
    await allGone(10_000)
    const { mostAtOnce, mostRssBytes, limits, oomScoreAdjs } = watch.stop()
    expect(mostAtOnce).toBeLessThanOrEqual(maxDecoders)
    expect(mostRssBytes).toBeLessThanOrEqual(maxDecoders * mediaProcessBounds.addressSpaceBytes)
    expect(limits.filter((limit) => limit !== String(mediaProcessBounds.addressSpaceBytes))).toEqual([])
    // Under memory pressure the kernel ends a decoder first, then an executor, before the platform.
    expect(oomScoreAdjs.filter((score) => score !== 1000)).toEqual([])
    const platformScore = readOomScoreAdj(platform.process.pid!)!
    for (const router of new Set(watch.seen().map((decoder) => decoder.parent)))
      expect(readOomScoreAdj(router)).toBe(Math.min(1000, platformScore + executorOomScoreMargin))
    await stillAnswers()
  }, 300_000)

  it("ends the decoders of a request whose client hangs up mid-decode within seconds, and starts none of the rest", async () => {
    const watch = watchDecoders(platform.process.pid!)
    const hangUp = new AbortController()
    const asked = ask(
      Array.from({ length: 16 }, () => slow),
      hangUp.signal
    ).catch((error: unknown) => error)
    await eventually(async () => (watch.seen().length > 0 ? true : undefined), 120_000)
    hangUp.abort()
    await asked
    await allGone(5_000)
    // And none starts after: the request's other videos were never decoded.
    const before = watch.seen().length
    await new Promise((resolve) => setTimeout(resolve, 2_000))
    const { mostAtOnce } = watch.stop()
    expect(watch.seen().length).toBe(before)
    expect(decodersBelow(platform.process.pid!)).toEqual([])
    expect(mostAtOnce).toBeLessThanOrEqual(maxDecoders)
    await stillAnswers()
  }, 300_000)

  it("takes a router's decoders with it when it is killed outright, and its successor removes their files", async () => {
    const watch = watchDecoders(platform.process.pid!)
    const asked = ask(Array.from({ length: 16 }, () => slow)).catch((error: unknown) => error)
    const [decoder] = await eventually(async () => {
      const running = decodersBelow(platform.process.pid!)
      return running.length > 0 ? running : undefined
    }, 120_000)
    const router = decoder!.parent
    expect(readFileSync(`/proc/${router}/cmdline`, "utf8")).toContain("executor")
    process.kill(router, "SIGKILL")
    const killedAt = Date.now()
    await eventually(async () => (watch.seen().every((seen) => !isAlive(seen.pid)) ? true : undefined), 3_000)
    expect(Date.now() - killedAt).toBeLessThan(3_000)
    watch.stop()
    await asked
    // The executor is started again, on the same run directory, and empties what its predecessor left there.
    await allGone(120_000)
    const fresh = await tinyVideo()
    await eventually(async () => ((await ask([fresh])).status === 200 ? true : undefined), 180_000)
  }, 400_000)
})
