/**
 * Prefill and decode apart (`npm run bench -- disagg`): 4 greedy streams decode on an LLM
 * executor while a ~2,000-token prompt joins. Two ways, in turns, on SmolLM2-135M's geometry
 * (`bench/smollm2-135m`, fp32, random weights), one thread a device:
 *
 * - together: one executor (cpu:0) runs the streams and prefills the joining prompt, in chunks
 *   between decode steps (the default chunked prefill);
 * - apart: a prefill executor (cpu:1) prefills it and sends its KV cache through the sidecar
 *   (`/v1/cornserve/kv-prefill`); the decode executor (cpu:0), which runs the streams, takes it
 *   (`cornserve_kv`) and prefills only the prompt's last part.
 *
 * For each: the streams' inter-token latency p99 alone and while the prompt joins (from its send
 * to just after its first token), and the joining prompt's time to first token. Then the KV cache's
 * way through the sidecar on one node: its bytes, and the decode executor's time to first token
 * with the cache sent against the same prompt found in its prefix cache already, per 1,000 tokens
 * of the cache. Prints a table, then (as the last line) one JSON object.
 *
 * Env: BENCH_ROUNDS (default 3), BENCH_JOIN_TOKENS (default 2000).
 */
import { randomUUID } from "node:crypto"
import { resolveModel } from "../src/models/ModelStore.js"
import { loadModelDirectory } from "../src/models/ModelDirectory.js"
import { ChatTokenizer } from "../src/models/Tokenizer.js"
import { executorHeaders, startExecutor, startSidecar } from "../test/support/executors.js"
import { median, percentile, round } from "./support/chat-stream.js"
import { textOfTokens, timedStream } from "./support/llm-prefill.js"

const model = "bench/smollm2-135m"
const rounds = Number(process.env.BENCH_ROUNDS ?? 3)
const joinTokens = Number(process.env.BENCH_JOIN_TOKENS ?? 2000)
const target = 1.5

type Executor = Awaited<ReturnType<typeof startExecutor>>

const post = async <T>(url: string, body: unknown): Promise<T> => {
  const response = await fetch(url, {
    method: "POST",
    headers: executorHeaders({ "content-type": "application/json" }),
    body: JSON.stringify(body)
  })
  const text = await response.text()
  if (response.status !== 200) throw new Error(`${url}: ${response.status} ${text}`)
  return JSON.parse(text) as T
}

/** A joining prompt's first token, through one executor or through the prefill and decode executors. */
type Join = (content: string) => Promise<number>

/**
 * Inter-token gaps (ms) of 4 streams on `url`: alone (after their first tokens), or while `join`
 * brings a prompt in (from its send to 300 ms after its first token); and that prompt's TTFT.
 */
const gaps = async (url: string, seed: number, join?: Join) => {
  const stop = new AbortController()
  const streams = [0, 1, 2, 3].map((i) =>
    timedStream(
      url,
      model,
      [{ role: "user", content: `Count to a thousand, slowly, number ${seed}.${i}.` }],
      join === undefined ? 120 : 4000,
      stop.signal
    )
  )
  // A stream hung up by `stop` ends with the chunks it had; any other failure is the bench's.
  const ended = streams.map((stream) =>
    stream.done.catch((error: unknown) => {
      if (stop.signal.aborted) return stream.chunks
      throw error
    })
  )
  for (const end of ended) end.catch(() => undefined)
  while (streams.some((stream) => stream.chunks.length < 8)) await new Promise((resolve) => setTimeout(resolve, 5))
  if (join === undefined) {
    const all = await Promise.all(ended)
    return { gaps: all.flatMap((times) => times.slice(9).map((time, i) => time - times[i + 8]!)), ttft: undefined }
  }
  const sent = performance.now()
  const first = await join(joinText(seed))
  await new Promise((resolve) => setTimeout(resolve, 300))
  stop.abort()
  const all = await Promise.all(ended)
  const end = first + 300
  return {
    gaps: all.flatMap((times) =>
      times.flatMap((time, i) => (i > 0 && time > sent && times[i - 1]! < end ? [time - times[i - 1]!] : []))
    ),
    ttft: first - sent
  }
}

let tokenizer: ChatTokenizer
const joinText = (seed: number) => textOfTokens(tokenizer, joinTokens, 5000 + seed)

/** When the first token of a greedy chat of `content` on `url` came (with `extra` in the request). */
const firstToken = async (url: string, content: string, extra: Record<string, unknown> = {}): Promise<number> => {
  let first = 0
  const response = await fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: executorHeaders({ "content-type": "application/json" }),
    body: JSON.stringify({
      model,
      messages: [{ role: "user", content }],
      max_tokens: 1,
      temperature: 0,
      stream: true,
      ...extra
    })
  })
  if (response.status !== 200) throw new Error(`${url}: ${response.status} ${await response.text()}`)
  for await (const _ of response.body!) {
    first ||= performance.now()
  }
  return first
}

export default async function main(): Promise<void> {
  console.error(
    `disagg bench: ${model} (building it on first use), a ~${joinTokens}-token prompt joining, ${rounds} rounds`
  )
  const modelDir = await resolveModel(model)
  tokenizer = new ChatTokenizer(await loadModelDirectory(modelDir))
  // The platform's default arena: a sent cache waits whole in it until the decode executor takes it.
  const sidecar = await startSidecar(`disagg-${process.pid}`, {}, 256 * 1024 * 1024)
  const llm = (device: string) =>
    startExecutor([
      "--kind",
      "llm",
      "--model",
      model,
      "--devices",
      device,
      "--threads-per-device",
      "1",
      "--max-batch-size",
      "8",
      "--sidecar-socket",
      sidecar.socket
    ])
  const started: Array<Executor> = []
  try {
    const [single, decode, prefill] = await Promise.all([llm("cpu:0"), llm("cpu:0"), llm("cpu:1")])
    started.push(single, decode, prefill)
    const together: Join = (content) => firstToken(single.url, content)
    const apart: Join = async (content) => {
      const id = `kv-${randomUUID().replaceAll("-", "")}`
      await post(`${prefill.url}/v1/cornserve/kv-prefill`, {
        model,
        messages: [{ role: "user", content }],
        id,
        receivers: [sidecar.nodeId]
      })
      return firstToken(decode.url, content, { cornserve_kv: { id } })
    }
    // Warm-up: both ways, every batch size the streams meet.
    await gaps(single.url, 1, together)
    await gaps(decode.url, 2, apart)
    const ways = { together: { url: single.url, join: together }, apart: { url: decode.url, join: apart } }
    const results = {
      together: { alone: [] as Array<number>, joined: [] as Array<number>, ttft: [] as Array<number> },
      apart: { alone: [] as Array<number>, joined: [] as Array<number>, ttft: [] as Array<number> }
    }
    for (let r = 0; r < rounds; r++) {
      const order = r % 2 === 0 ? (["together", "apart"] as const) : (["apart", "together"] as const)
      for (const way of order) {
        const { url, join } = ways[way]
        results[way].alone.push(...(await gaps(url, 10 + r)).gaps)
        const joined = await gaps(url, 20 + r * 2 + (way === "apart" ? 1 : 0), join)
        results[way].joined.push(...joined.gaps)
        results[way].ttft.push(joined.ttft!)
      }
      console.error(
        `  round ${r + 1}: ITL p99 joined, together ${round(percentile(results.together.joined, 99), 1)} ms, apart ${round(percentile(results.apart.joined, 99), 1)} ms`
      )
    }
    // The cache's way through the sidecar: sent and taken, against the same prompt found in the
    // decode executor's prefix cache already (the cache just taken put it there).
    const sent: Array<number> = []
    const cached: Array<number> = []
    let shape: ReadonlyArray<number> = []
    let bytes = 0
    for (let r = 0; r < rounds; r++) {
      const content = joinText(100 + r)
      const id = `kv-${randomUUID().replaceAll("-", "")}`
      const answer = await post<{ shape: ReadonlyArray<number>; dtype: string }>(
        `${prefill.url}/v1/cornserve/kv-prefill`,
        {
          model,
          messages: [{ role: "user", content }],
          id,
          receivers: [sidecar.nodeId]
        }
      )
      shape = answer.shape
      bytes = shape.reduce((product, dim) => product * dim, 1) * (answer.dtype === "float16" ? 2 : 4)
      let start = performance.now()
      sent.push((await firstToken(decode.url, content, { cornserve_kv: { id } })) - start)
      start = performance.now()
      cached.push((await firstToken(decode.url, content)) - start)
    }
    const positions = shape[2]!
    const perThousand = ((median(sent) - median(cached)) * 1000) / positions
    const summary = (way: "together" | "apart") => {
      const alone = percentile(results[way].alone, 99)
      const joined = percentile(results[way].joined, 99)
      return {
        aloneP99Ms: round(alone, 1),
        joinedP99Ms: round(joined, 1),
        joinedOverAlone: round(joined / alone, 2),
        joinTtftMs: round(median(results[way].ttft), 0)
      }
    }
    const together_ = summary("together")
    const apart_ = summary("apart")
    console.log(
      `disagg: ${model}, fp32, 1 thread a device, 4 streams, a ~${joinTokens}-token prompt joining, ${rounds} rounds`
    )
    console.log(
      "way                                   | ITL p99 alone ms | ITL p99 joined ms | joined / alone | joining TTFT ms"
    )
    console.log(
      `together (one executor, chunked)      | ${together_.aloneP99Ms} | ${together_.joinedP99Ms} | ${together_.joinedOverAlone} | ${together_.joinTtftMs}`
    )
    console.log(
      `apart (prefill cpu:1, decode cpu:0)   | ${apart_.aloneP99Ms} | ${apart_.joinedP99Ms} | ${apart_.joinedOverAlone} (target ≤ ${target}) | ${apart_.joinTtftMs}`
    )
    console.log(
      `KV cache sent: [${shape.join(", ")}], ${round(bytes / 2 ** 20, 1)} MiB; decode TTFT with it sent ${round(median(sent), 1)} ms, found cached ${round(median(cached), 1)} ms: the way through the sidecar and into the prefix cache ${round(perThousand, 1)} ms per 1,000 tokens (one node)`
    )
    console.log(
      JSON.stringify({
        bench: "disagg",
        model,
        joinTokens,
        rounds,
        together: together_,
        apart: apart_,
        kv: {
          shape,
          bytes,
          decodeTtftSentMs: round(median(sent), 1),
          decodeTtftCachedMs: round(median(cached), 1),
          transferMsPer1000Tokens: round(perThousand, 1)
        },
        targetsMet: apart_.joinedOverAlone <= target
      })
    )
  } finally {
    await Promise.all(started.map((executor) => executor.stop()))
    await sidecar.stop()
  }
}
