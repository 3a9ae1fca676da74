import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join, relative } from "node:path"
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest"
import { type FakeHub, type FixtureRepo, smolRepo, startFakeHub } from "../support/fakeHub.js"
import { adminHeaders, runCli, startPlatform } from "../support/platform.js"

const id = "onnx-community/SmolLM2-135M-Instruct"

let repo: FixtureRepo
let hub: FakeHub
let root: string
let env: Record<string, string>

beforeAll(async () => {
  repo = smolRepo()
  hub = await startFakeHub({ [id]: repo })
})

afterAll(async () => {
  await hub.close()
})

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-pull-"))
  env = {
    HF_ENDPOINT: hub.endpoint,
    HF_HUB_CACHE: join(root, "hf-cache"),
    HF_HUB_OFFLINE: "",
    HF_TOKEN: "",
    CORNSERVE_MODEL_DIR: join(root, "models")
  }
  hub.clearFaults()
  return () => rm(root, { recursive: true, force: true })
})

const filesIn = async (dir: string) =>
  (await readdir(dir, { recursive: true, withFileTypes: true }))
    .filter((entry) => entry.isFile() && !entry.name.startsWith(".cornserve-download"))
    .map((entry) => relative(dir, join(entry.parentPath, entry.name)))
    .sort()

describe("cornserve models pull", () => {
  it("downloads one dtype from HF_ENDPOINT, tells each file as it is verified, and prints the directory", async () => {
    const result = await runCli(["models", "pull", id, "--dtype", "q4"], env)
    expect(result.code).toBe(0)
    const dir = join(root, "models", "onnx-community", "SmolLM2-135M-Instruct")
    expect(result.stdout).toBe(`${dir}\n`)
    expect(result.stderr).toContain(`${id}: fetching 7 file(s)`)
    expect(result.stderr).toContain("dtype q4, commit 0123456789ab")
    expect(result.stderr).toContain("onnx/model_q4.onnx (sha256 verified)")
    expect(result.stderr).toContain("config.json (git-sha1 verified)")
    expect(await filesIn(dir)).toContain("onnx/model_q4.onnx")
    expect(await filesIn(dir)).not.toContain("onnx/model.onnx")
    expect(await readFile(join(dir, "onnx/model_q4.onnx"))).toEqual(
      repo.files.find((file) => file.path === "onnx/model_q4.onnx")!.bytes
    )

    // Pulled again: the hub is asked, nothing travels.
    const again = await runCli(["models", "pull", id, "--dtype", "q4"], env)
    expect(again.code).toBe(0)
    expect(again.stderr).toContain("fetching 0 file(s)")
  })

  it("refuses offline and explains bad ids and unknown repositories", async () => {
    const offline = await runCli(["models", "pull", id, "--offline"], env)
    expect(offline.code).toBe(1)
    expect(offline.stderr).toContain("is not on this machine and downloads are off")
    expect(offline.stderr).toContain(join(root, "models", "onnx-community", "SmolLM2-135M-Instruct"))

    const badId = await runCli(["models", "pull", "just-a-name"], env)
    expect(badId.code).toBe(1)
    expect(badId.stderr).toContain('"just-a-name" is not a hub model id: write it as org/name or org/name@revision')

    const missing = await runCli(["models", "pull", "onnx-community/nothing-here"], env)
    expect(missing.code).toBe(1)
    expect(missing.stderr).toContain(`model "onnx-community/nothing-here" was not found on ${hub.endpoint}`)
  })
})

describe("registering an app whose model is a hub id", () => {
  const appSource = `import { ChatCompletionRequest, defineApp, LLMTask } from "cornserve/app"
const llm = new LLMTask({ model: "${id}" })
export default defineApp({ tasks: { llm }, request: ChatCompletionRequest, serve: (request) => llm.invoke(request) })
`

  it("downloads the model on the node first, streaming its progress to the registration", async () => {
    const platform = await startPlatform({ args: ["--devices", "cpu:0"], env })
    const controller = new AbortController()
    try {
      // The registration's event stream, read until the download is done: the fixture's graphs are
      // stand-in bytes, so the executor that starts afterwards cannot load them.
      const response = await fetch(`${platform.url}/app/register`, {
        method: "POST",
        headers: adminHeaders({ "content-type": "application/json" }),
        body: JSON.stringify({ source: appSource, name: "smol_chat", replace: false }),
        signal: controller.signal
      })
      expect(response.status).toBe(200)
      let events = ""
      const wanted = `model ${id}: onnx/model.onnx_data is in place (sha256 checked)`
      for await (const chunk of response.body!.pipeThrough(new TextDecoderStream())) {
        events += chunk
        if (events.includes(wanted)) break
      }
      expect(events).toContain("event: progress")
      expect(events).toContain(`model ${id}: downloading 8 file(s), 0.1 MB, dtype fp32`)
      expect(events).toContain(`model ${id}: config.json is in place (git-sha1 checked)`)
      expect(events).toContain(wanted)
      expect(await filesIn(join(root, "models", "onnx-community", "SmolLM2-135M-Instruct"))).toEqual(
        [
          ...repo.files.map((file) => file.path).filter((path) => /\.(json|jinja)$|^onnx\/model\.onnx/.test(path))
        ].sort()
      )
    } finally {
      controller.abort()
      await platform.stop()
    }
  })

  it("fails the registration with the offline message under serve --offline", async () => {
    const platform = await startPlatform({ args: ["--devices", "cpu:0", "--offline"], env })
    try {
      const file = join(root, "smol_chat.ts")
      await writeFile(file, appSource)
      const asked = hub.requests.length
      const result = await runCli(["app", "register", file], { ...env, CORNSERVE_GATEWAY_URL: platform.url })
      expect(result.code).toBe(1)
      expect(result.stderr).toContain(`model "${id}" is not on this machine and downloads are off`)
      expect(hub.requests.length).toBe(asked)
    } finally {
      await platform.stop()
    }
  })
})
