import { connect } from "node:net"
import { readFile } from "node:fs/promises"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { registerRaw, removeStateDir, repoRoot, type RunningPlatform, startPlatform } from "../support/platform.js"

/** A small seeded generator (mulberry32), so that a failing run can be replayed. */
const seededRandom = (seed: number) => {
  let state = seed >>> 0
  const next = () => {
    state = (state + 0x6d2b79f5) >>> 0
    let t = state
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
  const int = (n: number) => Math.floor(next() * n)
  const pick = <A>(items: ReadonlyArray<A>): A => items[int(items.length)]!
  const bytes = (n: number) => Buffer.from(Array.from({ length: n }, () => int(256)))
  return { next, int, pick, bytes }
}
type Random = ReturnType<typeof seededRandom>

const appIds = ["hello", "nobody", "%E0%A4%A", "%", "%zz", "%00", "..%2F..%2Fetc", "a".repeat(300), "h%C3%A9llo", ""]

const paths = (random: Random): string => {
  const id = random.pick(appIds)
  return random.pick([
    `/app/invoke/${id}`,
    `/app/${id}/v1/chat/completions`,
    `/app/unregister/${id === "hello" ? "nobody" : id}`,
    "/app/register",
    "/app/list",
    "/tasks/list",
    "/task/scale",
    "/health",
    "/metrics",
    `/app/invoke/${id}?${"x=%".repeat(random.int(50))}`,
    `//app//invoke//${id}`,
    `/app/invoke/${id}/../../health`,
    `/${"%".repeat(random.int(20))}`,
    `/${"a/".repeat(random.int(2000))}`,
    "*",
    `http://example.com/app/invoke/${id}`,
    `/app/invoke/${Buffer.from([0xc3, 0x28, 0xe2, 0x82]).toString("latin1")}`
  ])
}

const deepJson = (depth: number, open: string, close: string, inner = "1") =>
  `${open.repeat(depth)}${inner}${close.repeat(depth)}`

const bodies = (random: Random): Buffer => {
  const text = random.pick<() => string | Buffer>([
    () => "",
    () => "{",
    () => "null",
    () => "[]",
    () => '"just a string"',
    () => "{}",
    () => '{"name":"Ada"}',
    () => '{"name":1e999}',
    () => '{"name":"\\ud800"}',
    () => '{"__proto__":{"admin":true},"name":"x"}',
    () => '{"constructor":{"prototype":{"polluted":1}}}',
    () => JSON.stringify({ name: deepJson(100, "[", "]") }),
    () => `{"name":${deepJson(100_000, "[", "]")}}`,
    () => `{"name":${deepJson(20_000, '{"a":', "}")}}`,
    () => `{"source":"export default 1","name":"${random.pick(appIds)}"}`,
    () => `{"taskId":"${random.pick(appIds)}","devices":${random.pick(["0", "-1", "1e9", '"1"', "null", "1.5"])}}`,
    () => '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:,"}}]}]}',
    () => `{"model":"m","messages":${random.pick(["null", "[]", "[{}]", '[{"role":"user","content":null}]'])}}`,
    () => random.bytes(random.int(2048)),
    () => Buffer.from([0xff, 0xfe, 0x00, 0x7b, 0x7d]),
    () => "x".repeat(random.int(200_000))
  ])()
  return typeof text === "string" ? Buffer.from(text) : text
}

const methods = [
  "GET",
  "POST",
  "POST",
  "POST",
  "PUT",
  "DELETE",
  "PATCH",
  "OPTIONS",
  "HEAD",
  "BREW",
  "G ET",
  "POST\u0000"
]

/** A request that is well framed (a real method, route and length) but carries a hostile URL or body. */
const hostileRequest = (random: Random): Buffer => {
  const body = bodies(random)
  const id = random.pick(["hello", "hello", "hello", ...appIds])
  const path = random.pick([
    `/app/invoke/${id}`,
    `/app/invoke/${id}`,
    `/app/${id}/v1/chat/completions`,
    "/app/register",
    "/task/scale",
    `/app/unregister/${id === "hello" ? "nobody" : id}`
  ])
  const contentType = random.pick(["application/json", "text/plain", "application/x-ndjson", undefined])
  const head = [
    `POST ${path} HTTP/1.1`,
    "Host: 127.0.0.1",
    "Connection: close",
    `Content-Length: ${body.length}`,
    ...(contentType === undefined ? [] : [`Content-Type: ${contentType}`])
  ]
  return Buffer.concat([Buffer.from(`${head.join("\r\n")}\r\n\r\n`, "latin1"), body])
}

/** One malformed HTTP/1.1 request, as raw bytes: anything a client or an attacker could send. */
const malformedRequest = (random: Random): Buffer => {
  if (random.int(2) === 0) return hostileRequest(random)
  const body = bodies(random)
  const headers: Array<string> = ["Host: 127.0.0.1", "Connection: close"]
  const lengthForm = random.int(10)
  if (lengthForm < 5) headers.push(`Content-Length: ${body.length}`)
  else if (lengthForm === 5)
    headers.push(`Content-Length: ${random.pick(["-1", "abc", "1e3", "99999999999999999999", ""])}`)
  else if (lengthForm === 6) headers.push(`Content-Length: ${body.length}`, `Content-Length: ${body.length + 1}`)
  else if (lengthForm === 7) headers.push("Transfer-Encoding: chunked")
  const extra = random.int(12)
  if (extra === 0)
    headers.push(
      `Content-Type: ${random.pick(["application/json", "text/plain", "multipart/form-data; boundary=", "\u00ff"])}`
    )
  if (extra === 1)
    headers.push(`Authorization: ${random.pick(["Bearer", "Bearer \u00e9", "Basic ???", "x".repeat(10_000)])}`)
  if (extra === 2) headers.push(`X-Long: ${"v".repeat(random.int(100_000))}`)
  if (extra === 3) headers.push("Bad Header Name: 1")
  if (extra === 4) headers.push("Expect: 100-continue")
  if (extra === 5) headers.push(`Origin: ${random.pick(["null", "http://evil.example", "\u0000"])}`)
  if (extra === 6) headers.push("Content-Encoding: gzip")
  if (extra === 7) headers.push(`Accept: ${random.pick(["text/event-stream", "*/*", "\u00e9"])}`)
  const version = random.int(20) === 0 ? random.pick(["HTTP/1.0", "HTTP/2.0", "HTTP/9", "FOO"]) : "HTTP/1.1"
  const head = `${random.pick(methods)} ${paths(random)} ${version}\r\n${headers.join("\r\n")}\r\n\r\n`
  let payload = body
  if (lengthForm === 7) {
    payload =
      random.int(2) === 0
        ? Buffer.concat([Buffer.from(`${body.length.toString(16)}\r\n`), body, Buffer.from("\r\n0\r\n\r\n")])
        : Buffer.concat([Buffer.from("zz\r\n"), body])
  }
  return Buffer.concat([Buffer.from(head, "latin1"), payload])
}

/** Sends raw bytes on a fresh connection, half-closes it, and returns the status code answered, if any. */
const sendRaw = (port: number, bytes: Buffer, timeoutMs = 3_000) =>
  new Promise<number | undefined>((resolve) => {
    const socket = connect(port, "127.0.0.1")
    let received = ""
    const done = () => {
      clearTimeout(timer)
      socket.destroy()
      const match = /^HTTP\/1\.[01] (\d{3})/.exec(received)
      resolve(match === null ? undefined : Number(match[1]))
    }
    const timer = setTimeout(done, timeoutMs)
    socket.on("data", (chunk) => {
      received += chunk.toString("latin1")
      if (received.length > 16) done()
    })
    socket.once("error", done)
    socket.once("close", done)
    socket.end(bytes)
  })

const requestCount = 2_000
const concurrency = 16

describe("cornserve serve under a seeded fuzz of malformed requests", () => {
  let platform: RunningPlatform
  let port: number

  beforeAll(async () => {
    platform = await startPlatform({ args: ["--devices", "cpu:0", "--max-body-bytes", "1048576"] })
    port = Number(new URL(platform.url).port)
    const source = await readFile(`${repoRoot}/examples/hello.ts`, "utf8")
    expect((await registerRaw(platform.url, { name: "hello", source })).text).toContain("event: final")
  })

  afterAll(async () => {
    await platform.stop()
    await removeStateDir(platform.stateDir)
  })

  it(`stays healthy through ${requestCount} malformed requests over every route, and never answers 500`, async () => {
    const seed = Number(process.env.CORNSERVE_FUZZ_SEED ?? 20261123)
    const random = seededRandom(seed)
    const requests = Array.from({ length: requestCount }, () => malformedRequest(random))
    const statuses = new Map<number | "none", number>()
    const serverErrors: Array<string> = []
    let next = 0
    const lane = async () => {
      while (next < requests.length) {
        const index = next++
        const status = await sendRaw(port, requests[index]!)
        statuses.set(status ?? "none", (statuses.get(status ?? "none") ?? 0) + 1)
        if (status !== undefined && status >= 500 && status !== 503) {
          serverErrors.push(
            `#${index} (seed ${seed}) answered ${status}: ${requests[index]!.subarray(0, 120).toString("latin1")}`
          )
        }
        expect(platform.process.exitCode, `the platform died on request #${index} (seed ${seed})`).toBeNull()
      }
    }
    await Promise.all(Array.from({ length: concurrency }, lane))
    console.log(`fuzz seed ${seed}: statuses ${JSON.stringify(Object.fromEntries(statuses))}`)
    expect(serverErrors).toEqual([])
    expect([...statuses.keys()].filter((status) => status !== "none").length).toBeGreaterThan(3)
    expect(platform.process.exitCode).toBeNull()
    expect((await fetch(`${platform.url}/health`)).status).toBe(200)
    const good = await fetch(`${platform.url}/app/invoke/hello`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ name: "Ada" })
    })
    expect(good.status).toBe(200)
    expect(await good.json()).toEqual({ greeting: "Hello, Ada! Cornserve is serving you." })
  }, 300_000)
})
