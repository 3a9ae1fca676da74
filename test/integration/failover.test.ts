import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { randomLlamaFiles } from "../../src/models/recipes/RandomLlama.js"
import { descendants } from "../support/executors.js"
import { adminHeaders, eventually, invoke, type RunningPlatform, runCli, startPlatform } from "../support/platform.js"

/**
 * LLM failover through the real binary: the LLM executor's worker is killed while eight greedy
 * streams are under way; the task's executor is restarted, every stream goes on from the tokens its
 * client has, and every client reads the text it reads when nothing fails. With prefill and decode
 * apart, the decode executor's worker is killed: the graph runs again, the prompt is prefilled
 * again and its cache sent again, and the streams go on alike.
 */

/**
 * Large enough that the 59 tokens after the 5th take a good part of a second even batched: the kill
 * must land while the streams are still decoding, also when a loaded machine makes this test's
 * reading of the streams lag behind the executor.
 */
const config = {
  hiddenSize: 256,
  intermediateSize: 512,
  layers: 8,
  heads: 4,
  kvHeads: 2,
  headDim: 64,
  vocabSize: 512,
  maxPositions: 512,
  ropeTheta: 10000,
  rmsNormEps: 1e-5
}

const streams = 8
const maxTokens = 64

const appSource = (model: string, task: "LLMTask" | "DisaggregatedLLMTask" = "LLMTask") => `
import { ChatCompletionRequest, defineApp, ${task} } from "cornserve/app"
const llm = new ${task}({ model: ${JSON.stringify(model)} })
export default defineApp({
  tasks: { llm },
  request: ChatCompletionRequest,
  serve: (request) => llm.invoke(request as never)
})
`

const request = (index: number) =>
  JSON.stringify({
    messages: [
      {
        role: "user",
        content: `Tell me story number ${index} about the sea, the ships that sail on it and the birds above them.`
      }
    ],
    max_tokens: maxTokens,
    temperature: 0
  })

/** One streamed answer, read line by line: its text, and a promise of its `n`-th chunk. */
const readStream = (response: Response) => {
  let chunks = 0
  const waiting: Array<{ readonly n: number; readonly resolve: () => void }> = []
  const text = (async () => {
    expect(response.status).toBe(200)
    const decoder = new TextDecoder()
    let pending = ""
    let said = ""
    for await (const bytes of response.body!) {
      pending += decoder.decode(bytes, { stream: true })
      const lines = pending.split("\n")
      pending = lines.pop()!
      for (const line of lines.filter((entry) => entry.trim().length > 0)) {
        const chunk = JSON.parse(line) as {
          error?: unknown
          choices?: Array<{ delta: { content?: string } }>
        }
        if (chunk.error !== undefined) throw new Error(`the stream failed: ${line}`)
        said += chunk.choices?.[0]?.delta.content ?? ""
        chunks++
        for (const waiter of waiting.filter((entry) => entry.n <= chunks)) waiter.resolve()
      }
    }
    return said
  })()
  return {
    text,
    reached: (n: number) =>
      n <= chunks ? Promise.resolve() : new Promise<void>((resolve) => waiting.push({ n, resolve }))
  }
}

/** The platform on `devices`, serving the stories app through `task`. */
const startStories = async (devices: string, task: "LLMTask" | "DisaggregatedLLMTask") => {
  const root = await mkdtemp(join(tmpdir(), "cornserve-failover-"))
  const model = join(root, "models", "tiny-llama")
  for (const [file, bytes] of randomLlamaFiles({ config, layout: "decoder-only", dtypes: ["fp32"] })) {
    await mkdir(dirname(join(model, file)), { recursive: true })
    await writeFile(join(model, file), bytes)
  }
  const platform = await startPlatform({
    args: ["--devices", devices],
    env: { CORNSERVE_MODEL_DIR: join(root, "models") }
  })
  const file = join(root, "stories.ts")
  await writeFile(file, appSource(model, task))
  const registered = await runCli(["app", "register", file], { CORNSERVE_GATEWAY_URL: platform.url })
  expect(registered.code, registered.stderr).toBe(0)
  return { root, platform }
}

const failoversOf = async (platform: RunningPlatform) => {
  const metrics = await (await fetch(`${platform.url}/metrics`, { headers: adminHeaders() })).text()
  return [...metrics.matchAll(/^cornserve_llm_failovers_total\{task="[^"]+"\} (\d+)/gm)].reduce(
    (sum, match) => sum + Number(match[1]),
    0
  )
}

describe("an LLM executor's worker dies mid-stream", () => {
  let platform: RunningPlatform
  let root: string

  beforeAll(async () => {
    ;({ root, platform } = await startStories("cpu:0", "LLMTask"))
  })

  afterAll(async () => {
    await platform?.stop()
    await rm(root, { recursive: true, force: true })
  })

  const ask = async () => {
    const answers = await Promise.all(
      Array.from({ length: streams }, (_, index) => invoke(platform.url, "stories", request(index)))
    )
    return answers.map(readStream)
  }

  it("goes on with every stream elsewhere, each client reading the text of a run without the failure", async () => {
    const undisturbed = await Promise.all((await ask()).map((stream) => stream.text))
    expect(undisturbed.every((text) => text.length > 0)).toBe(true)

    const worker = descendants(platform.process.pid!).find((entry) => entry.command.includes(" executor-worker "))
    expect(worker).toBeDefined()
    const disturbed = await ask()
    // Every stream has had its 5th token when the worker is killed.
    await Promise.all(disturbed.map((stream) => stream.reached(5)))
    process.kill(worker!.pid, "SIGKILL")
    const texts = await Promise.all(disturbed.map((stream) => stream.text))

    expect(texts).toEqual(undisturbed)
    expect(await failoversOf(platform)).toBeGreaterThanOrEqual(1)
    // The executor was restarted, and the task is whole again.
    await eventually(async () => {
      const listing = (await (await fetch(`${platform.url}/tasks/list`)).json()) as {
        tasks: Array<{ executors: Array<{ healthy: boolean; outstanding: number }> }>
      }
      const executors = listing.tasks.flatMap((task) => task.executors)
      return executors.length === 1 && executors[0]!.healthy && executors[0]!.outstanding === 0 ? true : undefined
    })
  })
})

describe("a decode executor's worker dies mid-stream, prefill and decode apart", () => {
  let platform: RunningPlatform
  let root: string

  beforeAll(async () => {
    ;({ root, platform } = await startStories("cpu:0,cpu:1", "DisaggregatedLLMTask"))
  })

  afterAll(async () => {
    await platform?.stop()
    await rm(root, { recursive: true, force: true })
  })

  it("runs the graph again: the prompts prefilled and their caches sent again, each client reads the undisturbed text", async () => {
    const ask = async () =>
      (
        await Promise.all(
          Array.from({ length: streams }, (_, index) => invoke(platform.url, "stories", request(index)))
        )
      ).map(readStream)
    const undisturbed = await Promise.all((await ask()).map((stream) => stream.text))
    expect(undisturbed.every((text) => text.length > 0)).toBe(true)

    const listing = (await (await fetch(`${platform.url}/tasks/list`, { headers: adminHeaders() })).json()) as {
      tasks: Array<{ config?: { phase?: string }; devices: ReadonlyArray<string> }>
    }
    const device = listing.tasks.find((task) => task.config?.phase === "decode")!.devices[0]!
    const decodeExecutor = descendants(platform.process.pid!).find(
      (entry) => entry.command.includes(" internal executor ") && entry.command.includes(` --devices ${device} `)
    )
    expect(decodeExecutor, device).toBeDefined()
    const worker = descendants(decodeExecutor!.pid).find((entry) => entry.command.includes(" executor-worker "))
    expect(worker).toBeDefined()
    const disturbed = await ask()
    await Promise.all(disturbed.map((stream) => stream.reached(5)))
    process.kill(worker!.pid, "SIGKILL")
    expect(await Promise.all(disturbed.map((stream) => stream.text))).toEqual(undisturbed)
    expect(await failoversOf(platform)).toBeGreaterThanOrEqual(1)
  })
})
