/**
 * The whole platform: examples/color_chat.ts at increasing request rates, with encoder fission
 * (Eric + LLM through the sidecar) and without (the LLM encodes the image itself), through the
 * gateway. In the same run the executors are called directly, wired through the sidecar as the
 * dispatcher wires them, so the platform's added latency (gateway, app worker, dispatcher) is a
 * difference measured on the same machine at the same moment.
 *
 * Env: BENCH_SECONDS (per rate and mode, default 6), BENCH_RATES (requests/s, default 2,5,10,20,40).
 */
import { randomUUID } from "node:crypto"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import sharp from "sharp"
import { internalSecretOf } from "../src/contracts/Credentials.js"
import { eventually, runCli, startPlatform } from "../test/support/platform.js"

const seconds = Number(process.env.BENCH_SECONDS ?? 6)
const rates = (process.env.BENCH_RATES ?? "2,5,10,20,40").split(",").map(Number)

const noFissionApp = `import { ChatCompletionRequest, defineApp, MLLMTask } from "cornserve/app"
const mllm = new MLLMTask({ model: "cornserve/tiny-color-vlm", modalities: ["image", "audio"], encoderFission: false })
export default defineApp({ tasks: { mllm }, request: ChatCompletionRequest, serve: (request) => mllm.invoke(request) })
`

const percentile = (values: ReadonlyArray<number>, p: number) => {
  if (values.length === 0) return Number.NaN
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!
}
const round = (value: number, digits = 1) => Number(value.toFixed(digits))

interface Phase {
  readonly rps: number
  readonly p50Ms: number
  readonly p99Ms: number
  readonly errors: number
}

/** Sends `one()` at `rate` per second for `ms` (open loop: on schedule, whatever the answers do). */
const openLoop = async (rate: number, ms: number, one: () => Promise<string>): Promise<Phase> => {
  const latencies: Array<number> = []
  let errors = 0
  const started = performance.now()
  const pending: Array<Promise<void>> = []
  for (let index = 0; index < Math.round((rate * ms) / 1000); index++) {
    const due = started + (index * 1000) / rate
    const wait = due - performance.now()
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait))
    pending.push(
      one().then(
        (text) => (text === "red" ? void latencies.push(performance.now() - due) : void errors++),
        () => void errors++
      )
    )
  }
  await Promise.all(pending)
  return {
    rps: round(latencies.length / ((performance.now() - started) / 1000), 2),
    p50Ms: round(percentile(latencies, 50)),
    p99Ms: round(percentile(latencies, 99)),
    errors
  }
}

const textOfStream = async (response: Response, format: "ndjson" | "sse") => {
  if (!response.ok) throw new Error(`HTTP ${response.status}`)
  let text = ""
  for (const line of (await response.text()).split("\n")) {
    const json = format === "sse" ? (line.startsWith("data: ") && !line.includes("[DONE]") ? line.slice(6) : "") : line
    if (json.trim().length === 0) continue
    text +=
      (JSON.parse(json) as { choices?: Array<{ delta?: { content?: string } }> }).choices?.[0]?.delta?.content ?? ""
  }
  return text
}

export default async function e2eBench(): Promise<void> {
  const work = mkdtempSync(join(tmpdir(), "cornserve-bench-e2e-"))
  writeFileSync(join(work, "color_chat_local.ts"), noFissionApp)
  // A cluster token makes the platform's internal secret one this bench can derive: the direct
  // calls carry it, as the dispatcher's do.
  const clusterToken = randomUUID()
  const executorHeaders = { authorization: `Bearer ${internalSecretOf(clusterToken)}` }
  const platform = await startPlatform({
    // No cache of encoder outputs: every request sends the same image, and the encoder is measured.
    args: ["--devices", "cpu:0,cpu:1,cpu:2,cpu:3", "--embedding-cache-bytes", "0"],
    env: { CORNSERVE_CLUSTER_TOKEN: clusterToken },
    stateDir: join(work, "state")
  })
  const env = { CORNSERVE_GATEWAY_URL: platform.url }
  try {
    for (const file of ["examples/color_chat.ts", join(work, "color_chat_local.ts")]) {
      const registered = await runCli(["app", "register", file], env)
      if (registered.code !== 0) throw new Error(registered.stderr)
    }
    const { tasks } = (await (await fetch(`${platform.url}/tasks/list`)).json()) as {
      tasks: Array<{ name: string; config: { receiveEmbeddings?: boolean }; executors: Array<{ url: string }> }>
    }
    const ericUrl = tasks.find((task) => task.name === "encoder-image-tiny-color-vlm")!.executors[0]!.url
    const llmUrl = tasks.find((task) => task.name === "llm-tiny-color-vlm" && task.config.receiveEmbeddings === true)!
      .executors[0]!.url
    const image = `data:image/png;base64,${(
      await sharp({ create: { width: 48, height: 48, channels: 3, background: { r: 235, g: 25, b: 20 } } })
        .png()
        .toBuffer()
    ).toString("base64")}`
    const messages = [
      {
        role: "user",
        content: [
          { type: "text", text: "What colour is this?" },
          { type: "image_url", image_url: { url: image } }
        ]
      }
    ]
    const body = JSON.stringify({ messages, max_tokens: 8 })

    const throughPlatform = (app: string) => () =>
      fetch(`${platform.url}/app/invoke/${app}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body
      }).then((response) => textOfStream(response, "ndjson"))
    /** What the dispatcher does for one fission request, without the gateway, the app and the dispatcher. */
    const direct = async () => {
      const id = randomUUID().replaceAll("-", "")
      const [, text] = await Promise.all([
        fetch(`${ericUrl}/embeddings`, {
          method: "POST",
          headers: { "content-type": "application/json", ...executorHeaders },
          body: JSON.stringify({ items: [{ id, modality: "image", url: image }], receivers: ["local"] })
        }).then((response) => response.arrayBuffer()),
        fetch(`${llmUrl}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json", ...executorHeaders },
          body: JSON.stringify({
            model: "cornserve/tiny-color-vlm",
            messages,
            max_tokens: 8,
            stream: true,
            cornserve_embeddings: [{ id, modality: "image" }]
          })
        }).then((response) => textOfStream(response, "sse"))
      ])
      return text
    }

    await eventually(async () => ((await throughPlatform("color_chat")()) === "red" ? true : undefined))
    const rows: Array<{
      rate: number
      direct: Phase
      fission: Phase
      noFission: Phase
      addedP50Ms: number
      addedP99Ms: number
    }> = []
    for (const rate of rates) {
      process.stderr.write(`rate ${rate}/s\n`)
      const directPhase = await openLoop(rate, seconds * 1000, direct)
      const fission = await openLoop(rate, seconds * 1000, throughPlatform("color_chat"))
      const noFission = await openLoop(rate, seconds * 1000, throughPlatform("color_chat_local"))
      rows.push({
        rate,
        direct: directPhase,
        fission,
        noFission,
        addedP50Ms: round(fission.p50Ms - directPhase.p50Ms, 2),
        addedP99Ms: round(fission.p99Ms - directPhase.p99Ms, 2)
      })
    }

    console.log(
      "e2e bench: color_chat (tiny-color-vlm), open loop; latency in ms from scheduled send to the last chunk"
    )
    console.log(
      "rate/s  direct rps p50 p99       fission rps p50 p99       no fission rps p50 p99     added p50 p99 (fission − direct)"
    )
    for (const row of rows) {
      const cell = (phase: Phase) =>
        `${String(phase.rps).padStart(5)} ${String(phase.p50Ms).padStart(7)} ${String(phase.p99Ms).padStart(7)}${phase.errors > 0 ? ` (${phase.errors} err)` : ""}`
      console.log(
        `${String(row.rate).padStart(6)}  ${cell(row.direct)}   ${cell(row.fission)}   ${cell(row.noFission)}   ${String(row.addedP50Ms).padStart(7)} ${String(row.addedP99Ms).padStart(7)}`
      )
    }
    console.log(JSON.stringify({ bench: "e2e", app: "color_chat", seconds, rates: rows }))
  } finally {
    await platform.stop()
    rmSync(work, { recursive: true, force: true })
  }
}
