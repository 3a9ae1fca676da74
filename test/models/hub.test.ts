import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from "node:fs/promises"
import * as Net from "node:net"
import { tmpdir } from "node:os"
import { join, relative } from "node:path"
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest"
import { chooseFiles, type ModelDownloadEvent, parseHubId } from "../../src/models/Hub.js"
import {
  DtypeUnavailable,
  HubAccessDenied,
  HubModelNotFound,
  HubRequestFailed,
  ModelChecksumMismatch,
  ModelOffline
} from "../../src/models/ModelErrors.js"
import { resolveModel } from "../../src/models/ModelStore.js"
import { type FakeHub, type FixtureRepo, smolRepo, startFakeHub } from "../support/fakeHub.js"

const id = "onnx-community/SmolLM2-135M-Instruct"
const supporting = [
  "chat_template.jinja",
  "config.json",
  "generation_config.json",
  "special_tokens_map.json",
  "tokenizer.json",
  "tokenizer_config.json"
]

const environment = ["HF_ENDPOINT", "HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HF_HOME", "CORNSERVE_MODEL_DIR"]
const saved = Object.fromEntries(environment.map((name) => [name, process.env[name]]))

let repo: FixtureRepo
let hub: FakeHub
let root: string
let modelDir: string

beforeAll(async () => {
  repo = smolRepo()
  hub = await startFakeHub({ [id]: repo })
})

afterAll(async () => {
  await hub.close()
})

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-hub-"))
  modelDir = join(root, "models")
  for (const name of environment) delete process.env[name]
  process.env.CORNSERVE_MODEL_DIR = modelDir
  process.env.HF_HUB_CACHE = join(root, "hf-cache")
  process.env.HF_ENDPOINT = hub.endpoint
  hub.clearFaults()
  hub.requests.length = 0
})

afterEach(async () => {
  for (const name of environment) {
    if (saved[name] === undefined) delete process.env[name]
    else process.env[name] = saved[name]
  }
  await rm(root, { recursive: true, force: true })
})

/** The files a user would see in `dir`, by relative path (the download record and parts aside). */
const filesIn = async (dir: string) =>
  (await readdir(dir, { recursive: true, withFileTypes: true }))
    .filter((entry) => entry.isFile() && !entry.name.startsWith(".cornserve-download"))
    .map((entry) => relative(dir, join(entry.parentPath, entry.name)))
    .sort()

const fixture = (path: string) => repo.files.find((file) => file.path === path)!.bytes

const rejection = async (promise: Promise<unknown>): Promise<unknown> =>
  promise.then(
    () => expect.fail("expected a failure"),
    (error: unknown) => error
  )

describe("parseHubId", () => {
  it("reads org/name and org/name@revision, and leaves paths and bare names alone", () => {
    expect(parseHubId(id)).toEqual({ repo: id, revision: "main" })
    expect(parseHubId(`${id}@v1.0`)).toEqual({ repo: id, revision: "v1.0" })
    for (const notAnId of [
      "/abs/path",
      "./org/name",
      "../org/name",
      "a/b/c",
      "name",
      "org/",
      "org/na--me",
      "org/..x"
    ]) {
      expect(parseHubId(notAnId)).toBeUndefined()
    }
  })
})

describe("chooseFiles", () => {
  const vlm = [
    "config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "tokenizer.json",
    "README.md",
    "onnx/vision_encoder.onnx",
    "onnx/vision_encoder_q4.onnx",
    "onnx/embed_tokens.onnx",
    "onnx/embed_tokens_q4.onnx",
    "onnx/decoder_model_merged.onnx",
    "onnx/decoder_model_merged.onnx_data",
    "onnx/decoder_model_merged.onnx_data_1",
    "onnx/decoder_model_merged_q4.onnx",
    "onnx/decoder_model_merged_q4.onnx_data",
    "onnx/decoder_model_q4.onnx",
    "onnx/decoder_with_past_model_q4.onnx",
    "onnx/decoder_model_merged_q4f16.onnx"
  ]

  it("takes every graph of a split export at one dtype, with its external data, and the configs", () => {
    expect(chooseFiles("vlm", vlm, "q4")).toEqual({
      dtype: "q4",
      files: [
        "config.json",
        "preprocessor_config.json",
        "processor_config.json",
        "tokenizer.json",
        "onnx/vision_encoder_q4.onnx",
        "onnx/embed_tokens_q4.onnx",
        "onnx/decoder_model_merged_q4.onnx",
        "onnx/decoder_model_merged_q4.onnx_data"
      ]
    })
    expect(chooseFiles("vlm", vlm, undefined).files).toEqual([
      "config.json",
      "preprocessor_config.json",
      "processor_config.json",
      "tokenizer.json",
      "onnx/vision_encoder.onnx",
      "onnx/embed_tokens.onnx",
      "onnx/decoder_model_merged.onnx",
      "onnx/decoder_model_merged.onnx_data",
      "onnx/decoder_model_merged.onnx_data_1"
    ])
  })

  it("defaults to the least lossy dtype there, and names the ones there when asked for another", () => {
    expect(chooseFiles("m", ["config.json", "onnx/model_q4.onnx", "onnx/model_fp16.onnx"], undefined).dtype).toBe(
      "fp16"
    )
    const error = (() => {
      try {
        chooseFiles("m", ["config.json", "onnx/model_q4.onnx", "onnx/model_fp16.onnx"], "int8")
      } catch (thrown) {
        return thrown
      }
    })()
    expect(error).toBeInstanceOf(DtypeUnavailable)
    expect((error as Error).message).toBe('model "m" has no ONNX files at dtype int8; it has fp16, q4')
    expect(() => chooseFiles("m", ["config.json", "model.safetensors"], undefined)).toThrow(
      /no ONNX files under onnx\//
    )
  })
})

describe("resolveModel with a hub id", () => {
  it("downloads the configs and the fp32 graph with its data, checked, with progress, then finds it offline", async () => {
    const events: Array<ModelDownloadEvent> = []
    const dir = await resolveModel(id, { onProgress: (event) => events.push(event) })
    expect(dir).toBe(join(modelDir, "onnx-community", "SmolLM2-135M-Instruct"))
    expect(await filesIn(dir)).toEqual([...supporting, "onnx/model.onnx", "onnx/model.onnx_data"].sort())
    for (const file of [...supporting, "onnx/model.onnx", "onnx/model.onnx_data"]) {
      expect(await readFile(join(dir, file))).toEqual(fixture(file))
    }
    const fetching = events.find((event) => event._tag === "Fetching")
    expect(fetching).toMatchObject({ dtype: "fp32", files: 8, commit: repo.commit })
    const verified = events.flatMap((event) => (event._tag === "Verified" ? [[event.file, event.check]] : []))
    expect(Object.fromEntries(verified)).toMatchObject({
      "config.json": "git-sha1",
      "onnx/model.onnx": "sha256",
      "onnx/model.onnx_data": "sha256"
    })
    const progress = events.filter((event) => event._tag === "Progress")
    expect(progress.at(-1)).toMatchObject({ overallBytes: fetching!.bytes, overallTotal: fetching!.bytes })

    hub.requests.length = 0
    process.env.HF_HUB_OFFLINE = "1"
    expect(await resolveModel(id)).toBe(dir)
    expect(hub.requests).toEqual([])
  })

  it("with --dtype q4 fetches the q4 graph only, and adds fp32 beside it when asked later", async () => {
    const dir = await resolveModel(id, { dtype: "q4" })
    expect(await filesIn(dir)).toEqual([...supporting, "onnx/model_q4.onnx"].sort())
    expect(hub.requests.filter((request) => request.server === "cdn")).toHaveLength(1)

    hub.requests.length = 0
    await resolveModel(id, { dtype: "fp32" })
    expect(await filesIn(dir)).toEqual(
      [...supporting, "onnx/model.onnx", "onnx/model.onnx_data", "onnx/model_q4.onnx"].sort()
    )
    // The configs were already here and verified: only the fp32 graph and its data travel.
    const fetched = hub.requests.filter((request) => request.path.includes("/resolve/")).map((request) => request.path)
    expect(fetched).toEqual([`/${id}/resolve/main/onnx/model.onnx`, `/${id}/resolve/main/onnx/model.onnx_data`])
  })

  it("names the dtypes there when asked for one that is not", async () => {
    const error = await rejection(resolveModel(id, { dtype: "bnb4" }))
    expect(error).toBeInstanceOf(DtypeUnavailable)
    expect((error as Error).message).toContain("has no ONNX files at dtype bnb4; it has fp32, fp16, q4")
  })

  it("resumes a transfer that broke off with a Range request, within the call and in the next one", async () => {
    hub.cut("onnx/model.onnx", 16 * 1024, 1)
    const dir = await resolveModel(id)
    expect(await readFile(join(dir, "onnx/model.onnx"))).toEqual(fixture("onnx/model.onnx"))
    const cdn = hub.requests.filter((request) => request.server === "cdn").map((request) => request.headers.range)
    expect(cdn).toContain(`bytes=${16 * 1024}-`)

    await rm(modelDir, { recursive: true, force: true })
    hub.requests.length = 0
    // Broken off on every try: the call fails, keeping what arrived.
    hub.cut("onnx/model.onnx_data", 8 * 1024, 3)
    const error = await rejection(resolveModel(id))
    expect(error).toBeInstanceOf(HubRequestFailed)
    expect((error as Error).message).toMatch(
      /onnx\/model\.onnx_data broke off.*tried 3 times; 24576 bytes kept in .*model\.onnx_data\.part/
    )
    expect((await stat(join(dir, "onnx/model.onnx_data.part"))).size).toBe(24 * 1024)
    // Half finished: never used as it is.
    process.env.HF_HUB_OFFLINE = "1"
    await expect(resolveModel(id)).rejects.toBeInstanceOf(ModelOffline)
    delete process.env.HF_HUB_OFFLINE

    hub.requests.length = 0
    expect(await resolveModel(id)).toBe(dir)
    expect(await readFile(join(dir, "onnx/model.onnx_data"))).toEqual(fixture("onnx/model.onnx_data"))
    const resumed = hub.requests.filter((request) => request.server === "cdn")
    expect(resumed.map((request) => request.headers.range)).toEqual([`bytes=${24 * 1024}-`])
    expect(await filesIn(dir)).not.toContain("onnx/model.onnx_data.part")
  })

  it("removes a file whose digest is not the one listed, and says so", async () => {
    hub.corrupt("onnx/model_q4.onnx")
    const error = await rejection(resolveModel(id, { dtype: "q4" }))
    expect(error).toBeInstanceOf(ModelChecksumMismatch)
    expect((error as Error).message).toMatch(
      /onnx\/model_q4\.onnx arrived with sha256 [0-9a-f]{64} but the hub lists [0-9a-f]{64}; the file was removed/
    )
    const dir = join(modelDir, "onnx-community", "SmolLM2-135M-Instruct")
    expect(await filesIn(dir)).not.toContain("onnx/model_q4.onnx")
    expect(await filesIn(dir)).not.toContain("onnx/model_q4.onnx.part")
  })

  it("sends HF_TOKEN to the hub, never to the CDN it redirects to", async () => {
    hub.requireToken("hf_secret")
    process.env.HF_TOKEN = "hf_secret"
    await resolveModel(id, { dtype: "q4" })
    const hubRequests = hub.requests.filter((request) => request.server === "hub")
    expect(hubRequests.length).toBeGreaterThan(0)
    for (const request of hubRequests) expect(request.headers.authorization).toBe("Bearer hf_secret")
    const cdnRequests = hub.requests.filter((request) => request.server === "cdn")
    expect(cdnRequests).toHaveLength(1)
    expect(cdnRequests[0]!.headers.authorization).toBeUndefined()
  })

  it("says what to do about 401 and 403, and names the id and the endpoint on a 404", async () => {
    hub.requireToken("hf_secret")
    const denied = await rejection(resolveModel(id))
    expect(denied).toBeInstanceOf(HubAccessDenied)
    expect((denied as Error).message).toContain(`${hub.endpoint} refused access to model "${id}" (401`)
    expect((denied as Error).message).toContain("set HF_TOKEN to a token that can read it")

    process.env.HF_TOKEN = "hf_wrong"
    const refused = await rejection(resolveModel(id))
    expect((refused as Error).message).toContain("(403")
    expect((refused as Error).message).toContain("HF_TOKEN was sent but cannot read it")

    hub.clearFaults()
    const missing = await rejection(resolveModel("onnx-community/no-such-model"))
    expect(missing).toBeInstanceOf(HubModelNotFound)
    expect((missing as Error).message).toBe(
      `model "onnx-community/no-such-model" was not found on ${hub.endpoint}: no such repository`
    )
    const noRevision = await rejection(resolveModel(`${id}@v9`))
    expect((noRevision as Error).message).toContain("the listing of revision v9: no such revision")
  })

  it("fails clearly when the hub cannot be reached", async () => {
    const server = Net.createServer()
    const port = await new Promise<number>((resolve) =>
      server.listen(0, "127.0.0.1", () => resolve((server.address() as Net.AddressInfo).port))
    )
    await new Promise((resolve) => server.close(resolve))
    process.env.HF_ENDPOINT = `http://127.0.0.1:${port}`
    const error = await rejection(resolveModel(id))
    expect(error).toBeInstanceOf(HubRequestFailed)
    expect((error as Error).message).toContain(`downloading model "${id}" from http://127.0.0.1:${port} failed`)
    expect((error as Error).message).toContain("ECONNREFUSED")
  })

  it("uses a Hugging Face cache snapshot (HF_HUB_CACHE, or HF_HOME/hub) without any request", async () => {
    const writeSnapshot = async (cache: string) => {
      const repoDir = join(cache, "models--onnx-community--SmolLM2-135M-Instruct")
      const snapshot = join(repoDir, "snapshots", repo.commit)
      await mkdir(join(snapshot, "onnx"), { recursive: true })
      await mkdir(join(repoDir, "refs"), { recursive: true })
      await writeFile(join(repoDir, "refs", "main"), `${repo.commit}\n`)
      await writeFile(join(snapshot, "config.json"), fixture("config.json"))
      await writeFile(join(snapshot, "onnx", "model_q4.onnx"), fixture("onnx/model_q4.onnx"))
      return snapshot
    }
    process.env.HF_ENDPOINT = "http://127.0.0.1:9"
    const snapshot = await writeSnapshot(join(root, "hf-cache"))
    expect(await resolveModel(id)).toBe(snapshot)
    expect(await resolveModel(id, { dtype: "q4", offline: true })).toBe(snapshot)
    expect(await resolveModel(`${id}@${repo.commit}`)).toBe(snapshot)

    delete process.env.HF_HUB_CACHE
    process.env.HF_HOME = join(root, "hf-home")
    const underHome = await writeSnapshot(join(root, "hf-home", "hub"))
    expect(await resolveModel(id, { offline: true })).toBe(underHome)
    expect(hub.requests).toEqual([])
  })

  it("refuses to download when offline, saying where it looked", async () => {
    for (const offline of [{ offline: true }, {}]) {
      if (!("offline" in offline)) process.env.HF_HUB_OFFLINE = "1"
      const error = await rejection(resolveModel(id, offline))
      expect(error).toBeInstanceOf(ModelOffline)
      expect((error as Error).message).toBe(
        `model "${id}" is not on this machine and downloads are off (--offline or HF_HUB_OFFLINE=1); looked in ` +
          `${join(modelDir, "onnx-community", "SmolLM2-135M-Instruct")} and ` +
          `${join(root, "hf-cache", "models--onnx-community--SmolLM2-135M-Instruct")}`
      )
    }
    expect(hub.requests).toEqual([])
  })

  it("uses a directory placed under the model directory by hand, and an allowed local directory before the hub", async () => {
    const placed = join(modelDir, "onnx-community", "SmolLM2-135M-Instruct")
    await mkdir(join(placed, "onnx"), { recursive: true })
    await writeFile(join(placed, "config.json"), "{}")
    await writeFile(join(placed, "onnx", "model_fp16.onnx"), "")
    expect(await resolveModel(id)).toBe(placed)
    await expect(resolveModel(id, { dtype: "q4" })).rejects.toThrow(/has no ONNX files at dtype q4; it has fp16/)

    const cwd = process.cwd()
    process.chdir(root)
    try {
      await mkdir(join(root, "local", "model"), { recursive: true })
      await writeFile(join(root, "local", "model", "config.json"), "{}")
      expect(await resolveModel("local/model", { modelRoots: [root] })).toBe(join(root, "local", "model"))
      expect(hub.requests).toEqual([])
      // Outside the allowed roots the directory is not looked at: the id is a hub id.
      await expect(resolveModel("local/model")).rejects.toThrow(/not found on/)
    } finally {
      process.chdir(cwd)
    }
  })

  it("lets two concurrent resolutions share one download", async () => {
    const [first, second] = await Promise.all([resolveModel(id, { dtype: "q4" }), resolveModel(id, { dtype: "q4" })])
    expect(first).toBe(second)
    expect(hub.requests.filter((request) => request.server === "cdn")).toHaveLength(1)
    expect(await readFile(join(first, "onnx/model_q4.onnx"))).toEqual(fixture("onnx/model_q4.onnx"))
  })
})
