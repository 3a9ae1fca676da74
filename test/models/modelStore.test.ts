import * as esbuild from "esbuild"
import { execFile } from "node:child_process"
import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from "node:fs/promises"
import { homedir, tmpdir } from "node:os"
import { delimiter, join, relative } from "node:path"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { InvalidModelDirectory, loadModelDirectory, onnxPath } from "../../src/models/ModelDirectory.js"
import {
  benchModelNames,
  buildModel,
  builtinModelNames,
  disallowedModelPath,
  modelCacheDir,
  resolveModel,
  UnknownModel
} from "../../src/models/ModelStore.js"

let root: string

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-store-"))
})

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

const savedModelDir = process.env.CORNSERVE_MODEL_DIR
afterEach(() => {
  if (savedModelDir === undefined) delete process.env.CORNSERVE_MODEL_DIR
  else process.env.CORNSERVE_MODEL_DIR = savedModelDir
})

/** Every file under `dir` with its bytes, by relative path. */
const snapshot = async (dir: string): Promise<Map<string, Buffer>> => {
  const files = new Map<string, Buffer>()
  for (const entry of await readdir(dir, { recursive: true, withFileTypes: true })) {
    if (entry.isFile())
      files.set(relative(dir, join(entry.parentPath, entry.name)), await readFile(join(entry.parentPath, entry.name)))
  }
  return files
}

const leftovers = async (dir: string) => (await readdir(dir)).filter((entry) => entry.startsWith("."))

describe("buildModel", () => {
  it("names the built-in models and the benchmark presets", () => {
    expect(builtinModelNames).toEqual([
      "cornserve/tiny-color-vlm",
      "cornserve/tiny-color-painter",
      "cornserve/tiny-color-tones",
      "cornserve/tiny-text-embedder",
      "cornserve/tiny-whisper",
      "cornserve/tiny-speecht5",
      "cornserve/tiny-janus",
      "cornserve/tiny-mimi",
      "cornserve/tiny-talker"
    ])
    expect(benchModelNames).toEqual([
      "bench/vit-b16",
      "bench/decoder-125m",
      "bench/smollm2-135m",
      "bench/llama-3.2-1b",
      "bench/qwen2-vl-2b",
      "bench/minilm-l6"
    ])
  })

  it("writes byte-identical files on every build, replacing an earlier build in place", async () => {
    for (const name of builtinModelNames) {
      const first = await snapshot(await buildModel(name, join(root, "first")))
      const second = await snapshot(await buildModel(name, join(root, "second")))
      const again = await snapshot(await buildModel(name, join(root, "first")))
      expect([...first.keys()].sort()).toEqual([...second.keys()].sort())
      for (const [file, bytes] of first) {
        expect(bytes.equals(second.get(file)!), `${name}/${file}`).toBe(true)
        expect(bytes.equals(again.get(file)!), `${name}/${file}`).toBe(true)
      }
    }
    expect(await leftovers(join(root, "first", "cornserve"))).toEqual([])
  })

  it("lays out each built-in as a loadable model directory", async () => {
    const vlm = await loadModelDirectory(join(root, "first", "cornserve/tiny-color-vlm"))
    expect([...vlm.onnx.keys()]).toEqual(["audio_encoder", "decoder_model_merged", "embed_tokens", "vision_encoder"])
    expect(vlm.decoder).toMatchObject({ hiddenSize: 64, layers: 2, keyValueHeads: 4, headDim: 16 })
    expect(vlm.config).toMatchObject({ image_seq_length: 64, audio_seq_length: 40 })
    expect(typeof vlm.tokenizer?.config.chat_template).toBe("string")
    for (const name of ["cornserve/tiny-color-painter", "cornserve/tiny-color-tones"]) {
      const generator = await loadModelDirectory(join(root, "first", name))
      expect(onnxPath(generator, "generator")).toMatch(/onnx\/generator\.onnx$/)
      expect(generator.config.prompt_embeddings).toEqual({
        model: "cornserve/tiny-color-vlm",
        source: "embed_tokens",
        hidden_size: 64
      })
    }
  })

  it("refuses a name that is no recipe", async () => {
    await expect(buildModel("cornserve/no-such-model", root)).rejects.toBeInstanceOf(UnknownModel)
  })
})

describe("resolveModel", () => {
  it("uses CORNSERVE_MODEL_DIR, or ~/.cache/cornserve/models", () => {
    delete process.env.CORNSERVE_MODEL_DIR
    expect(modelCacheDir()).toBe(join(homedir(), ".cache", "cornserve", "models"))
    process.env.CORNSERVE_MODEL_DIR = "/somewhere/else"
    expect(modelCacheDir()).toBe("/somewhere/else")
  })

  it("builds a built-in model into the cache on first use, once, even when asked for at the same time", async () => {
    const cache = join(root, "cache")
    process.env.CORNSERVE_MODEL_DIR = cache
    const dirs = await Promise.all(Array.from({ length: 4 }, () => resolveModel("cornserve/tiny-color-painter")))
    expect(new Set(dirs)).toEqual(new Set([join(cache, "cornserve/tiny-color-painter")]))
    expect(await leftovers(join(cache, "cornserve"))).toEqual([])
    const built = await stat(join(dirs[0]!, "onnx/generator.onnx"))

    await resolveModel("cornserve/tiny-color-painter")
    expect((await stat(join(dirs[0]!, "onnx/generator.onnx"))).mtimeMs).toBe(built.mtimeMs)
    expect((await loadModelDirectory(dirs[0]!)).config.generator?.modality).toBe("image")
  })

  it("gives two processes asking at once the same complete build", async () => {
    const cache = join(root, "process-cache")
    const script = join(root, "resolve.mjs")
    // The store compiled to one plain script, so that separate node processes can run it.
    await esbuild.build({
      stdin: {
        contents: `import { resolveModel } from ${JSON.stringify(join(process.cwd(), "src/models/ModelStore.ts"))}
          console.log(await resolveModel(process.argv[2]))`,
        resolveDir: process.cwd(),
        loader: "ts"
      },
      bundle: true,
      platform: "node",
      format: "esm",
      outfile: script,
      logLevel: "silent"
    })
    const resolveInProcess = () =>
      new Promise<string>((resolvePath, reject) => {
        execFile(
          process.execPath,
          [script, "cornserve/tiny-color-vlm"],
          { env: { ...process.env, CORNSERVE_MODEL_DIR: cache } },
          (error, stdout) => (error === null ? resolvePath(stdout.trim()) : reject(error))
        )
      })
    const dirs = await Promise.all([resolveInProcess(), resolveInProcess()])
    expect(dirs).toEqual([join(cache, "cornserve/tiny-color-vlm"), join(cache, "cornserve/tiny-color-vlm")])
    expect(await leftovers(join(cache, "cornserve"))).toEqual([])
    const reference = await snapshot(await buildModel("cornserve/tiny-color-vlm", join(root, "reference")))
    const shared = await snapshot(dirs[0]!)
    expect([...shared.keys()].sort()).toEqual([...reference.keys()].sort())
    for (const [file, bytes] of reference) expect(bytes.equals(shared.get(file)!), file).toBe(true)
  })

  it("rebuilds a cached model that an older recipe built", async () => {
    process.env.CORNSERVE_MODEL_DIR = join(root, "stale-cache")
    const dir = await resolveModel("cornserve/tiny-color-tones")
    const configPath = join(dir, "config.json")
    const current = await readFile(configPath, "utf8")
    await writeFile(configPath, current.replace(/"version": \d+/, '"version": 0'))
    expect(await resolveModel("cornserve/tiny-color-tones")).toBe(dir)
    expect(await readFile(configPath, "utf8")).toBe(current)
  })

  it("takes any other id as the path of a local model directory below an allowed root", async () => {
    const modelRoots = [root]
    const local = join(root, "my-model")
    await mkdir(join(local, "onnx"), { recursive: true })
    await writeFile(join(local, "config.json"), JSON.stringify({ model_type: "mine" }))
    expect(await resolveModel(local, { modelRoots })).toBe(local)
    expect(await resolveModel(relative(process.cwd(), local), { modelRoots })).toBe(local)

    await expect(resolveModel(join(root, "missing"), { modelRoots })).rejects.toThrow(/no directory exists/)
    await mkdir(join(root, "empty"))
    await expect(resolveModel(join(root, "empty"), { modelRoots })).rejects.toThrow(/holds no config\.json/)
  })

  it("takes model directories below the model cache and CORNSERVE_MODEL_ROOTS without being told", async () => {
    const cache = join(root, "roots-cache")
    const operator = join(root, "roots-operator")
    for (const dir of [join(cache, "mine"), join(operator, "mine")]) {
      await mkdir(dir, { recursive: true })
      await writeFile(join(dir, "config.json"), JSON.stringify({ model_type: "mine" }))
    }
    process.env.CORNSERVE_MODEL_DIR = cache
    expect(await resolveModel(join(cache, "mine"))).toBe(join(cache, "mine"))
    await expect(resolveModel(join(operator, "mine"))).rejects.toThrow(/not a model directory this node allows/)
    process.env.CORNSERVE_MODEL_ROOTS = ["/nowhere", operator].join(delimiter)
    try {
      expect(await resolveModel(join(operator, "mine"))).toBe(join(operator, "mine"))
    } finally {
      delete process.env.CORNSERVE_MODEL_ROOTS
    }
  })

  it("refuses a path outside the allowed roots with one message, whatever is there", async () => {
    const modelRoots = [join(root, "allowed")]
    const model = join(root, "elsewhere")
    await mkdir(join(model, "onnx"), { recursive: true })
    await writeFile(join(model, "config.json"), JSON.stringify({ model_type: "mine" }))
    await writeFile(join(root, "a-file"), "")
    const refusal = async (id: string) => {
      const error = await resolveModel(id, { modelRoots }).then(
        () => undefined,
        (e: unknown) => e
      )
      expect(error, id).toBeInstanceOf(UnknownModel)
      return (error as UnknownModel).message.replace(id, "ID")
    }
    const messages = await Promise.all(
      [
        model, // a whole model directory
        join(root, "a-file"),
        join(root, "no-such-dir"),
        "/",
        "/etc",
        "/no/such/directory",
        join(root, "allowed", "..", "elsewhere"), // out through ..
        join(root, "allowed-not"), // a sibling whose name starts like the root's
        relative(process.cwd(), model)
      ].map(refusal)
    )
    expect(new Set(messages).size).toBe(1)
    expect(messages[0]).not.toMatch(/exist|config\.json|directory at/)
    expect(messages[0]).toContain("--model-root")
  })

  it("tells by the id alone, as a registration asks, which model paths it would refuse", async () => {
    const modelRoots = [join(root, "allowed")]
    expect(disallowedModelPath("cornserve/tiny-color-vlm", modelRoots)).toBeUndefined()
    expect(disallowedModelPath("onnx-community/SmolLM2-135M-Instruct@main", modelRoots)).toBeUndefined()
    expect(disallowedModelPath(join(root, "allowed", "mine"), modelRoots)).toBeUndefined()
    const refusal = disallowedModelPath("/etc", modelRoots)
    expect(refusal).toBeInstanceOf(UnknownModel)
    expect(refusal?.message.replace("/etc", "ID")).toBe(
      disallowedModelPath("/no/such/dir", modelRoots)?.message.replace("/no/such/dir", "ID")
    )
  })

  it("does not echo a long model id whole", async () => {
    const error = await resolveModel(`/${"x".repeat(5_000)}`).then(
      () => undefined,
      (e: unknown) => e as UnknownModel
    )
    expect(error?.message.length).toBeLessThan(1_000)
  })
})

describe("loadModelDirectory", () => {
  const directory = async (name: string, files: Record<string, string>) => {
    const dir = join(root, "dirs", name)
    for (const [file, content] of Object.entries(files)) {
      await mkdir(join(dir, file, ".."), { recursive: true })
      await writeFile(join(dir, file), content)
    }
    return dir
  }
  const onnx = { "onnx/model.onnx": "" }

  const rejection = async (dir: string) => {
    const error = await loadModelDirectory(dir).then(
      () => undefined,
      (e: unknown) => e
    )
    expect(error).toBeInstanceOf(InvalidModelDirectory)
    return (error as InvalidModelDirectory).message
  }

  it("explains what is wrong with a directory", async () => {
    expect(await rejection(join(root, "dirs", "nothing-here"))).toMatch(/does not exist/)
    expect(await rejection(await directory("no-config", onnx))).toMatch(/config\.json is missing/)
    expect(await rejection(await directory("bad-json", { "config.json": "{", ...onnx }))).toMatch(
      /config\.json is not valid JSON/
    )
    expect(await rejection(await directory("array", { "config.json": "[]", ...onnx }))).toMatch(
      /must hold a JSON object/
    )
    expect(await rejection(await directory("no-type", { "config.json": "{}", ...onnx }))).toMatch(/model_type/)
    expect(
      await rejection(await directory("bad-decoder", { "config.json": '{"model_type":"x","vocab_size":10}', ...onnx }))
    ).toMatch(/hidden_size/)
    expect(await rejection(await directory("no-onnx", { "config.json": '{"model_type":"x"}' }))).toMatch(
      /no onnx\/ folder/
    )
    expect(
      await rejection(await directory("empty-onnx", { "config.json": '{"model_type":"x"}', "onnx/README": "" }))
    ).toMatch(/no \.onnx file/)
    expect(
      await rejection(
        await directory("half-tokenizer", {
          "config.json": '{"model_type":"x"}',
          "tokenizer_config.json": "{}",
          ...onnx
        })
      )
    ).toMatch(/tokenizer\.json is missing/)
  })

  it("names the ONNX files a directory has when one is missing", async () => {
    const model = await loadModelDirectory(await directory("minimal", { "config.json": '{"model_type":"x"}', ...onnx }))
    expect(model.decoder).toBeUndefined()
    expect(model.tokenizer).toBeUndefined()
    expect(() => onnxPath(model, "decoder_model_merged")).toThrow(
      /no onnx\/decoder_model_merged\.onnx \(it has model\.onnx\)/
    )
  })
})
