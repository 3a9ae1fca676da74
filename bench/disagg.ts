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
 * way: its bytes; on one node, the decode executor's time to first token with the cache sent
 * (arrival checked, the cache copied into the request's rows, the last token run) against a
 * one-word prompt's, per 1,000 tokens of the cache; across nodes, the same cache's chunks sent by
 * a sidecar client to a second node's sidecar over TCP (loopback) against to its own node, per
 * 1,000 tokens. Prints a table, then (as the last line) one JSON object.
 *
 * Env: BENCH_ROUNDS (default 3), BENCH_JOIN_TOKENS (default 2000).
 */
import { randomUUID } from "node:crypto"
import { resolveModel } from "../src/models/ModelStore.js"
import { loadModelDirectory } from "../src/models/ModelDirectory.js"
import { ChatTokenizer } from "../src/models/Tokenizer.js"
import { internalSecretEnv } from "../src/sidecar/InternalSecret.js"
import { SidecarClient } from "../src/sidecar/SidecarClient.js"
import { Tensor } from "../src/sidecar/Tensor.js"
import { executorHeaders, executorSecret, startExecutor, startSidecar } from "../test/support/executors.js"
import { freePort } from "../test/support/platform.js"
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
  // A second node's sidecar, a peer over TCP on the loopback address, for the way across nodes.
  const [portA, portB] = [await freePort(), await freePort()]
  const nodeA = `disagg-a-${process.pid}`
  const nodeB = `disagg-b-${process.pid}`
  const peering = (port: number, peer: string, peerPort: number) => [
    "--peer-host",
    "127.0.0.1",
    "--peer-port",
    String(port),
    "--peers",
    `${peer}=127.0.0.1:${peerPort}`
  ]
  const secret = internalSecretEnv(executorSecret)
  const sidecar = await startSidecar(nodeA, secret, 256 * 1024 * 1024, peering(portA, nodeB, portB))
  const remote = await startSidecar(nodeB, secret, 256 * 1024 * 1024, peering(portB, nodeA, portA))
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
    // The cache's way on one node: sent and taken by the decode executor, against a one-word prompt.
    const sent: Array<number> = []
    const short: Array<number> = []
    let shape: ReadonlyArray<number> = []
    let bytes = 0
    for (let r = 0; r < rounds; r++) {
      const content = joinText(100 + r)
      const id = `kv-${randomUUID().replaceAll("-", "")}`
      const answer = await post<{ shape: ReadonlyArray<number>; dtype: string }>(
        `${prefill.url}/v1/cornserve/kv-prefill`,
        { model, messages: [{ role: "user", content }], id, receivers: [sidecar.nodeId] }
      )
      shape = answer.shape
      bytes = shape.reduce((product, dim) => product * dim, 1) * (answer.dtype === "float16" ? 2 : 4)
      let start = performance.now()
      sent.push((await firstToken(decode.url, content, { cornserve_kv: { id } })) - start)
      start = performance.now()
      short.push((await firstToken(decode.url, `word ${r}`)) - start)
    }
    const positions = shape[2]!
    const perThousand = ((median(sent) - median(short)) * 1000) / positions
    // Across nodes: the same cache's chunks from node A's sidecar to node B's over TCP, against to A itself.
    const client = await SidecarClient.connect(sidecar.socket)
    const receiver = await SidecarClient.connect(remote.socket)
    const [tensors, heads, , headDim] = shape as [number, number, number, number]
    const chunk = new Float32Array(heads * positions * headDim).fill(0.5)
    const sendCache = async (to: string) => {
      const id = `kv-way-${randomUUID().replaceAll("-", "")}`
      const start = performance.now()
      for (let t = 0; t < tensors; t++)
        await client.send(id, new Tensor("float32", [heads, positions, headDim], chunk), {
          to: [to],
          chunk: t,
          numChunks: tensors
        })
      const took = performance.now() - start
      await (to === nodeA ? client : receiver).markDone(id)
      return took
    }
    const localWay: Array<number> = []
    const remoteWay: Array<number> = []
    try {
      for (let r = 0; r < rounds + 1; r++) {
        const [local, across] = [await sendCache(nodeA), await sendCache(nodeB)]
        // The first of each warms the way up.
        if (r > 0) {
          localWay.push(local)
          remoteWay.push(across)
        }
      }
    } finally {
      await client.close()
      await receiver.close()
    }
    const acrossPerThousand = ((median(remoteWay) - median(localWay)) * 1000) / positions
    const summary = (way: "together" | "apart") => {
      const alone = percentile(results[way].alone, 99)
      const joined = percentile(results[way].joined, 99)
      return {
        aloneP99Ms: round(alone, 1),
        joinedP99Ms: round(joined, 1),
        joinedOverAlone: round(joined / alone, 2),
        // The one longest gap: the step the prompt joins in, which p99 over every gap may leave out.
        joinedMaxMs: round(Math.max(...results[way].joined), 1),
        joinTtftMs: round(median(results[way].ttft), 0)
      }
    }
    const together_ = summary("together")
    const apart_ = summary("apart")
    console.log(
      `disagg: ${model}, fp32, 1 thread a device, 4 streams, a ~${joinTokens}-token prompt joining, ${rounds} rounds`
    )
    console.log(
      "way                                   | ITL p99 alone ms | ITL p99 joined ms | joined / alone | longest gap joined ms | joining TTFT ms"
    )
    console.log(
      `together (one executor, chunked)      | ${together_.aloneP99Ms} | ${together_.joinedP99Ms} | ${together_.joinedOverAlone} | ${together_.joinedMaxMs} | ${together_.joinTtftMs}`
    )
    console.log(
      `apart (prefill cpu:1, decode cpu:0)   | ${apart_.aloneP99Ms} | ${apart_.joinedP99Ms} | ${apart_.joinedOverAlone} (target ≤ ${target}) | ${apart_.joinedMaxMs} | ${apart_.joinTtftMs}`
    )
    console.log(
      `KV cache sent: [${shape.join(", ")}], ${round(bytes / 2 ** 20, 1)} MiB; one node: decode TTFT with it ${round(median(sent), 1)} ms, a one-word prompt's ${round(median(short), 1)} ms: ${round(perThousand, 1)} ms per 1,000 tokens`
    )
    console.log(
      `across nodes (sidecar to sidecar over TCP, loopback): ${round(median(remoteWay), 1)} ms, to its own node ${round(median(localWay), 1)} ms: ${round(acrossPerThousand, 1)} ms more per 1,000 tokens`
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
          decodeTtftShortMs: round(median(short), 1),
          oneNodeMsPer1000Tokens: round(perThousand, 1),
          sendLocalMs: round(median(localWay), 1),
          sendAcrossMs: round(median(remoteWay), 1),
          acrossNodesMsPer1000Tokens: round(acrossPerThousand, 1)
        },
        targetsMet: apart_.joinedOverAlone <= target
      })
    )
  } finally {
    await Promise.all(started.map((executor) => executor.stop()))
    await Promise.all([sidecar.stop(), remote.stop()])
  }
}
