import { spawn } from "node:child_process"
import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { credentialHeaders } from "../../src/control/executor-calls/ExecutorHttp.js"
import { internalSecretOf } from "../../src/contracts/Credentials.js"
import type { LlmStats } from "../../src/executors/llm/api.js"
import {
  adminHeaders,
  binPath,
  removeStateDir,
  type RunningPlatform,
  repoRoot,
  runCli,
  startPlatform
} from "../support/platform.js"

/**
 * An LLM task's engine settings, through the real binary: what an app sets (batch size, KV cache
 * budget) is what its executor runs with, as its stats say and `tasks show` prints; what it
 * leaves out takes `serve`'s flags; a bad field is refused at registration, one line naming it;
 * and a request whose KV cache cannot fit in the budget even alone is a 400 that says the bytes.
 */

const model = "cornserve/tiny-color-vlm"
/** The model's KV cache: 2 layers × key and value × 4 heads × 16 dims × 4 bytes a position. */
const bytesPerPosition = 1024
/** 512 positions (two of the store's blocks) for running requests, 256 KiB for prefixes. */
const kvCacheBytes = 768 * 1024
const prefixCacheBytes = 256 * 1024
const clusterToken = "task-settings-test-cluster-token"

const appSource = (options: string) => `
import { ChatCompletionRequest, defineApp, LLMTask } from "cornserve/app"
const llm = new LLMTask({ model: ${JSON.stringify(model)}${options} })
export default defineApp({
  tasks: { llm },
  request: ChatCompletionRequest,
  serve: (request) => llm.invoke(request)
})
`

interface TaskListing {
  readonly id: string
  readonly name: string
  readonly usedBy: ReadonlyArray<string>
  readonly settings: Record<string, unknown>
  readonly executors: ReadonlyArray<{ readonly url: string | null }>
}

let platform: RunningPlatform
let root: string

const cli = (args: ReadonlyArray<string>) => runCli(args, { CORNSERVE_GATEWAY_URL: platform.url })

/**
 * `app register` as a user runs it, waited on until it exits: it returns once the task's executor
 * is ready, which on a busy machine takes longer than runCli's bound on a quick command.
 */
const register = async (app: string, options: string) => {
  const file = join(root, `${app}.ts`)
  await writeFile(file, appSource(options))
  const child = spawn(process.execPath, [binPath, "app", "register", file], {
    cwd: repoRoot,
    env: { ...process.env, CORNSERVE_GATEWAY_URL: platform.url },
    stdio: ["ignore", "pipe", "pipe"]
  })
  let stdout = ""
  let stderr = ""
  child.stdout.on("data", (chunk: Buffer) => {
    stdout += chunk.toString()
  })
  child.stderr.on("data", (chunk: Buffer) => {
    stderr += chunk.toString()
  })
  const code = await new Promise<number | null>((resolve) => child.once("exit", resolve))
  return { code, stdout, stderr }
}

const taskOf = async (app: string): Promise<TaskListing> => {
  const { tasks } = (await (await fetch(`${platform.url}/tasks/list`, { headers: adminHeaders() })).json()) as {
    readonly tasks: ReadonlyArray<TaskListing>
  }
  return tasks.find((task) => task.usedBy.includes(app))!
}

/** The stats of the task's executor, asked as the platform asks them (with its internal secret). */
const statsOf = async (task: TaskListing): Promise<LlmStats> => {
  const response = await fetch(`${task.executors[0]!.url}/v1/cornserve/stats`, {
    headers: credentialHeaders(internalSecretOf(clusterToken))
  })
  expect(response.status).toBe(200)
  return (await response.json()) as LlmStats
}

const chat = async (app: string, maxTokens: number) => {
  const response = await fetch(`${platform.url}/app/${app}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      messages: [{ role: "user", content: "What colour is this?" }],
      max_tokens: maxTokens
    })
  })
  return { status: response.status, body: (await response.json()) as { readonly error?: { readonly message: string } } }
}

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-task-settings-"))
  platform = await startPlatform({
    args: ["--devices", "cpu:0", "--llm-max-batch-size", "5"],
    env: { CORNSERVE_CLUSTER_TOKEN: clusterToken }
  })
  const sized = await register(
    "sized",
    `, maxBatchSize: 3, kvCacheBytes: ${kvCacheBytes}, prefixCacheBytes: ${prefixCacheBytes}`
  )
  expect(sized.code, sized.stderr).toBe(0)
}, 600_000)

afterAll(async () => {
  await platform?.stop()
  if (platform !== undefined) await removeStateDir(platform.stateDir)
  if (root !== undefined) await rm(root, { recursive: true, force: true })
})

describe("an LLM task's engine settings", () => {
  it("reach its executor: its stats show the batch size and the KV cache budget the app set", async () => {
    const stats = await statsOf(await taskOf("sized"))
    expect(stats.maxBatchSize).toBe(3)
    expect(stats.kvCache).toMatchObject({ budgetBytes: kvCacheBytes, prefixBytes: prefixCacheBytes, bytesPerPosition })
    expect(stats.prefixCache?.maxBytes).toBe(prefixCacheBytes)
    // The decoder it runs: not a 4-bit one, so nothing about its activations.
    expect(stats.decoder).toEqual({ file: expect.stringMatching(/^onnx\/.+\.onnx$/), dtype: expect.any(String) })
  })

  it("are what tasks show prints, and tasks list", async () => {
    const task = await taskOf("sized")
    const shown = await cli(["tasks", "show", task.id])
    expect(shown.code, shown.stderr).toBe(0)
    expect(shown.stdout).toMatch(/^ {2}maxBatchSize +3$/m)
    expect(shown.stdout).toMatch(/^ {2}kvCacheBytes +786432 \(768 KiB\)$/m)
    expect(shown.stdout).toMatch(/^ {2}prefixCacheBytes +262144 \(256 KiB\)$/m)
    const listed = await cli(["tasks", "list"])
    expect(listed.stdout).toContain("maxBatchSize=3")
    expect(listed.stdout).toContain("kvCacheBytes=768 KiB")
  })

  it("answer a request that fits, and refuse one whose KV cache cannot fit even alone with a 400 naming the bytes", async () => {
    const answered = await chat("sized", 4)
    expect(answered.status, JSON.stringify(answered.body)).toBe(200)
    const refused = await chat("sized", 600)
    expect(refused.status).toBe(400)
    // Prompt and 600 tokens: three blocks of 256 positions, 1 KiB each.
    expect(refused.body.error?.message).toContain(`needs ${3 * 256 * bytesPerPosition} bytes of KV cache`)
    expect(refused.body.error?.message).toContain(`budget is ${kvCacheBytes} bytes`)
  })

  it("left out, take serve's flags; a task that differs only in them is another deployment", async () => {
    const registered = await register("chunked", ", prefillChunkTokens: 32")
    expect(registered.code, registered.stderr).toBe(0)
    const sized = await taskOf("sized")
    const chunked = await taskOf("chunked")
    expect(chunked.id).not.toBe(sized.id)
    expect(chunked.settings).toMatchObject({ maxBatchSize: 5, prefillChunkTokens: 32 })
    const stats = await statsOf(chunked)
    expect(stats.maxBatchSize).toBe(5)
    expect(stats.prefillChunkTokens).toBe(32)
    // It starts an executor of its own, as the first app's did in beforeAll.
  }, 300_000)

  it("are checked at registration: one line per bad field, naming it", async () => {
    const refused = await register("bad", ', maxBatchSize: 0, kvCacheMode: "fast" as never')
    expect(refused.code).not.toBe(0)
    const output = refused.stdout + refused.stderr
    expect(output).toMatch(/^\s*maxBatchSize: .*between 1 and 4096.*$/m)
    expect(output).toMatch(/^\s*kvCacheMode: expected "shared" or "copies".*$/m)
  }, 120_000)
})
