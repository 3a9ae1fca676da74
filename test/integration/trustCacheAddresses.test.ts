/**
 * Trust, against the real binary. The cache of encoder outputs keys an item on what the encoder
 * reads: the same bytes sent as raw PCM16 and as a WAV file are two clips, and whichever is sent
 * first, the other is answered as a platform with a cold cache answers it. A media URL or an
 * outbound host that names loopback in an IPv6 form standing for an IPv4 address (IPv4-mapped,
 * IPv4-translated, NAT64) is refused like loopback itself. An app holds as many tunnels through
 * its outbound proxy as the proxy's cap says, each counted once.
 */
import { readFileSync } from "node:fs"
import { mkdtemp, rm } from "node:fs/promises"
import { createServer, type Server } from "node:http"
import { createServer as createTcpServer, type Socket } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { wavFile } from "../../src/executors/common/media/Wav.js"
import { maxTunnels } from "../../src/control/app-manager/OutboundProxy.js"
import { tone } from "../models/support/Synthetic.js"
import { chatRequest, streamedText } from "../support/colorChatRequest.js"
import {
  adminHeaders,
  appState,
  eventually,
  invoke,
  registerRaw,
  removeStateDir,
  repoRoot,
  type RunningPlatform,
  startPlatform
} from "../support/platform.js"

/** A tone as a WAV file: at a rate above the model's, so that its samples read as raw PCM16 sound lower. */
const toneWav = (hertz: number, sampleRate: number) =>
  wavFile([Int16Array.from(tone(hertz, sampleRate, 0.5, 0.5), (sample) => Math.round(sample * 32767))], sampleRate)

/** Two clips, so that each order of the two readings meets a cache that has seen neither reading of its clip. */
const clips = { first: toneWav(1000, 48_000), second: toneWav(900, 44_100) }
type Clip = keyof typeof clips
type Format = "wav" | "pcm16"

const audioRequest = (clip: Clip, format: Format) =>
  JSON.stringify({
    messages: [
      {
        role: "user",
        content: [
          { type: "text", text: "Is this tone high or low?" },
          { type: "input_audio", input_audio: { data: clips[clip].toString("base64"), format } }
        ]
      }
    ],
    max_tokens: 8
  })

const imageUrlRequest = (url: string) =>
  JSON.stringify({
    messages: [
      {
        role: "user",
        content: [
          { type: "text", text: "What colour is this?" },
          { type: "image_url", image_url: { url } }
        ]
      }
    ],
    max_tokens: 8
  })

const ask = async (platform: RunningPlatform, clip: Clip, format: Format): Promise<string> => {
  const response = await invoke(platform.url, "color_chat", audioRequest(clip, format))
  if (response.status !== 200) expect.fail(`${clip} as ${format}: ${response.status} ${await response.text()}`)
  return streamedText(response)
}

const cacheLookups = async (url: string, result: "hit" | "miss"): Promise<number> => {
  const text = await (await fetch(`${url}/metrics`, { headers: adminHeaders() })).text()
  return text
    .split("\n")
    .filter((line) => line.startsWith("cornserve_embedding_cache_lookups_total{") && line.includes(`"${result}"`))
    .reduce((sum, line) => sum + Number(line.slice(line.lastIndexOf(" ") + 1)), 0)
}

/** Loopback, written as IPv6 forms that stand for it. */
const loopbackForms = ["::ffff:127.0.0.1", "::ffff:7f00:1", "::ffff:0:127.0.0.1", "64:ff9b::127.0.0.1"]

describe("what the platform trusts", () => {
  let modelDir: string
  let platform: RunningPlatform
  /** Each reading of each clip, as a platform without a cache of encoder outputs answers it. */
  const cold = new Map<string, string>()
  /** A local HTTP service, counting the requests that reach it. */
  let service: Server
  let servicePort = 0
  let reached = 0

  const startColorChat = async (args: ReadonlyArray<string>) => {
    const started = await startPlatform({
      args: ["--devices", "cpu:0,cpu:1,cpu:2", "--sidecar-arena-bytes", String(64 * 1024 * 1024), ...args],
      env: { CORNSERVE_MODEL_DIR: modelDir }
    })
    // Over HTTP, with no deadline: on a loaded machine the first deploy builds the models for a while.
    const registered = await registerRaw(started.url, {
      name: "color_chat",
      source: readFileSync(join(repoRoot, "examples", "color_chat.ts"), "utf8")
    })
    expect(registered.text).toContain("event: final")
    expect(await appState(started.url, "color_chat")).toBe("ready")
    return started
  }

  beforeAll(async () => {
    modelDir = await mkdtemp(join(tmpdir(), "cornserve-models-"))
    const reference = await startColorChat(["--embedding-cache-bytes", "0"])
    try {
      for (const clip of ["first", "second"] as const) {
        for (const format of ["wav", "pcm16"] as const)
          cold.set(`${clip} ${format}`, await ask(reference, clip, format))
      }
    } finally {
      expect(await reference.stop()).toBe(0)
      await removeStateDir(reference.stateDir)
    }
    platform = await startColorChat([])
    service = createServer((_, response) => {
      reached++
      response.end("reached")
    })
    await new Promise<void>((resolve) => service.listen(0, "127.0.0.1", resolve))
    servicePort = (service.address() as { port: number }).port
  }, 600_000)

  afterAll(async () => {
    if (platform !== undefined) {
      expect(await platform.stop()).toBe(0)
      await removeStateDir(platform.stateDir)
    }
    if (service !== undefined) await new Promise((resolve) => service.close(resolve))
    if (modelDir !== undefined) await rm(modelDir, { recursive: true, force: true })
  })

  it("tells the two readings of a clip apart without a cache: the WAV is a high tone, its samples as PCM16 a low one", () => {
    expect(cold.get("first wav")).toBe("high")
    expect(cold.get("first pcm16")).toBe("low")
    expect(cold.get("second wav")).toBe("high")
    expect(cold.get("second pcm16")).toBe("low")
  })

  it("answers the same bytes as PCM16 then as WAV, and as WAV then as PCM16, each as a cold cache does", async () => {
    const [hits, misses] = [await cacheLookups(platform.url, "hit"), await cacheLookups(platform.url, "miss")]
    expect(await ask(platform, "first", "pcm16")).toBe(cold.get("first pcm16"))
    expect(await ask(platform, "first", "wav")).toBe(cold.get("first wav"))
    expect(await ask(platform, "second", "wav")).toBe(cold.get("second wav"))
    expect(await ask(platform, "second", "pcm16")).toBe(cold.get("second pcm16"))
    expect(await cacheLookups(platform.url, "miss")).toBe(misses + 4)
    // The cache is at work: each reading sent again is a hit, answered as before.
    for (const clip of ["first", "second"] as const) {
      for (const format of ["pcm16", "wav"] as const)
        expect(await ask(platform, clip, format)).toBe(cold.get(`${clip} ${format}`))
    }
    expect(await cacheLookups(platform.url, "hit")).toBe(hits + 4)
  })

  it("refuses a media URL that names loopback in an IPv4-mapped, IPv4-translated or NAT64 form", async () => {
    for (const host of loopbackForms) {
      const response = await invoke(
        platform.url,
        "color_chat",
        imageUrlRequest(`http://[${host}]:${servicePort}/red.png`)
      )
      expect(response.status, host).toBe(400)
      expect(await response.text(), host).toMatch(/private address/)
    }
    expect(reached).toBe(0)
    // The platform still answers an image it may read.
    expect(await streamedText(await invoke(platform.url, "color_chat", chatRequest))).toBe("red")
  })

  it("refuses an outbound host allowed by a registration that names loopback in those forms", async () => {
    const registered = await registerRaw(platform.url, {
      name: "outbound_client",
      source: readFileSync(join(repoRoot, "test", "fixtures", "apps", "outbound_client.ts"), "utf8"),
      allowHosts: loopbackForms.map((host) => `[${host}]:${servicePort}`)
    })
    expect(registered.text).toContain("event: final")
    for (const host of loopbackForms) {
      for (const request of [
        { action: "fetch", url: `http://[${host}]:${servicePort}/` },
        { action: "connect", host, port: servicePort, line: "hi" }
      ]) {
        const response = await invoke(platform.url, "outbound_client", JSON.stringify(request))
        expect(response.status).toBe(200)
        const answer = (await response.json()) as { refused?: string; refusedStatus?: number }
        expect(answer.refusedStatus, `${request.action} ${host}`).toBe(403)
        expect(answer.refused, `${request.action} ${host}`).toContain("resolves to no public address")
      }
    }
    expect(reached).toBe(0)
  })
})

describe("an app's tunnels through its outbound proxy", () => {
  let platform: RunningPlatform
  /** A TCP service on loopback that holds every connection open. */
  let service: ReturnType<typeof createTcpServer>
  const held = new Set<Socket>()
  let servicePort = 0

  beforeAll(async () => {
    service = createTcpServer((socket) => {
      held.add(socket)
      socket.on("error", () => undefined)
      socket.once("close", () => held.delete(socket))
    })
    await new Promise<void>((resolve) => service.listen(0, "127.0.0.1", resolve))
    servicePort = (service.address() as { port: number }).port
    // The service runs on this machine's loopback: the operator allows private addresses.
    platform = await startPlatform({ args: ["--devices", "cpu:0", "--allow-private-outbound"] })
    const registered = await registerRaw(platform.url, {
      name: "outbound_tunnels",
      source: readFileSync(join(repoRoot, "test", "fixtures", "apps", "outbound_tunnels.ts"), "utf8"),
      allowHosts: [`127.0.0.1:${servicePort}`]
    })
    expect(registered.text).toContain("event: final")
  }, 120_000)

  afterAll(async () => {
    if (platform !== undefined) {
      expect(await platform.stop()).toBe(0)
      await removeStateDir(platform.stateDir)
    }
    for (const socket of held) socket.destroy()
    if (service !== undefined) await new Promise((resolve) => service.close(resolve))
  })

  const holdTunnels = async (count: number) => {
    const response = await invoke(
      platform.url,
      "outbound_tunnels",
      JSON.stringify({ host: "127.0.0.1", port: servicePort, count })
    )
    expect(response.status).toBe(200)
    return (await response.json()) as { held: number; refusedStatus?: number }
  }

  it(`counts each tunnel once: an app holds ${maxTunnels} at once, and is refused the next with 429`, async () => {
    expect(await holdTunnels(maxTunnels + 8)).toEqual({ held: maxTunnels, refusedStatus: 429 })
    // The tunnels it closed are given back (once the proxy has seen them close): it holds as many again.
    await eventually(async () => ((await holdTunnels(maxTunnels)).held === maxTunnels ? true : undefined), 10_000)
  })
})
