import { readFileSync } from "node:fs"
import { request as httpRequest, type IncomingMessage } from "node:http"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  invoke,
  registerRaw,
  removeStateDir,
  repoRoot,
  type RunningPlatform,
  startPlatform
} from "../support/platform.js"

const fixture = (name: string) => readFileSync(join(repoRoot, "test", "fixtures", "apps", `${name}.ts`), "utf8")
const example = (name: string) => readFileSync(join(repoRoot, "examples", `${name}.ts`), "utf8")

/** The resident memory of a process, in bytes. */
const residentBytes = (pid: number): number => {
  const line = readFileSync(`/proc/${pid}/status`, "utf8")
    .split("\n")
    .find((entry) => entry.startsWith("VmRSS:"))!
  return Number(/(\d+)/.exec(line)![1]) * 1024
}

/** POSTs `body` to an app and hands over the response unread, paused, for the caller to read at its pace. */
const openStream = (url: string, appId: string, body: string) =>
  new Promise<{ response: IncomingMessage; close: () => void }>((resolve, reject) => {
    const target = new URL(`/app/invoke/${appId}`, url)
    const outgoing = httpRequest(
      { host: target.hostname, port: target.port, path: target.pathname, method: "POST" },
      (response) => {
        response.pause()
        resolve({ response, close: () => outgoing.destroy() })
      }
    )
    outgoing.once("error", reject)
    outgoing.setHeader("content-type", "application/json")
    outgoing.end(body)
  })

/** Checks that NDJSON lines number themselves 0, 1, 2, … and counts them. */
const lineChecker = () => {
  let pending = ""
  let expected = 0
  return {
    take(text: string) {
      pending += text
      const lines = pending.split("\n")
      pending = lines.pop()!
      for (const line of lines) {
        expect((JSON.parse(line) as { seq: number }).seq).toBe(expected)
        expected++
      }
    },
    get lines() {
      return expected
    }
  }
}

describe("a slow client slows the app down instead of filling the gateway's memory", () => {
  let platform: RunningPlatform

  beforeAll(async () => {
    platform = await startPlatform({ args: ["--devices", "cpu:0"] })
    for (const [name, source] of [
      ["firehose", fixture("firehose")],
      ["countdown", example("countdown")],
      ["hello", example("hello")]
    ] as const) {
      expect((await registerRaw(platform.url, { name, source })).text).toContain("event: final")
    }
  })

  afterAll(async () => {
    await platform.stop()
    await removeStateDir(platform.stateDir)
  })

  it("streams 64 KiB lines to a client reading 10 kB a second for 30 s, in order, in bounded memory", async () => {
    const pid = platform.process.pid!
    const before = residentBytes(pid)
    let peak = before
    const { response, close } = await openStream(platform.url, "firehose", "{}")
    expect(response.statusCode).toBe(200)
    const checker = lineChecker()
    for (let second = 0; second < 30; second++) {
      await new Promise((resolve) => setTimeout(resolve, 1_000))
      let taken = 0
      while (taken < 10_000 && response.readableLength > 0) {
        const chunk = response.read(Math.min(10_000 - taken, response.readableLength)) as Buffer | null
        if (chunk === null) break
        taken += chunk.length
        checker.take(chunk.toString("utf8"))
      }
      peak = Math.max(peak, residentBytes(pid))
    }
    close()
    expect(checker.lines).toBeGreaterThan(0)
    expect(peak - before).toBeLessThan(50 * 1024 * 1024)
    expect((await invoke(platform.url, "hello", JSON.stringify({ name: "Ada" }))).status).toBe(200)
  }, 60_000)

  it("still streams at full speed to a client that reads as fast as it can", async () => {
    const { response, close } = await openStream(platform.url, "firehose", "{}")
    const checker = lineChecker()
    response.setEncoding("utf8")
    await new Promise<void>((resolve) => {
      response.on("data", (text: string) => {
        checker.take(text)
        if (checker.lines >= 500) {
          close()
          resolve()
        }
      })
      response.resume()
    })
    expect(checker.lines).toBeGreaterThanOrEqual(500)

    const countdown = await invoke(platform.url, "countdown", JSON.stringify({ from: 100, intervalMs: 0 }))
    const lines = (await countdown.text()).trim().split("\n")
    expect(lines.map((line) => (JSON.parse(line) as { count: number }).count)).toEqual(
      Array.from({ length: 100 }, (_, index) => 100 - index)
    )
  }, 60_000)
})
