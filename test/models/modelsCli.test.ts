import { createHash } from "node:crypto"
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join, relative } from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { runCli } from "../support/platform.js"

const files = async (dir: string): Promise<Array<string>> =>
  (await readdir(dir, { recursive: true, withFileTypes: true }))
    .filter((entry) => entry.isFile())
    .map((entry) => relative(dir, join(entry.parentPath, entry.name)))
    .sort()

const digest = async (dir: string) => {
  const hash = createHash("sha256")
  for (const file of await files(dir)) hash.update(file).update(await readFile(join(dir, file)))
  return hash.digest("hex")
}

describe("cornserve models build", () => {
  const dirs: Array<string> = []
  afterAll(async () => Promise.all(dirs.map((dir) => rm(dir, { recursive: true, force: true }))))

  it("builds every built-in model, the same bytes each time", async () => {
    const [first, second] = [
      await mkdtemp(join(tmpdir(), "cornserve-build-")),
      await mkdtemp(join(tmpdir(), "cornserve-build-"))
    ]
    dirs.push(first, second)
    const result = await runCli(["models", "build", "--dir", first])
    expect(result.code).toBe(0)
    for (const name of [
      "cornserve/tiny-color-vlm",
      "cornserve/tiny-color-painter",
      "cornserve/tiny-color-tones",
      "cornserve/tiny-text-embedder",
      "cornserve/tiny-whisper"
    ]) {
      expect(result.stdout).toContain(`built ${name}`)
    }
    expect(await files(join(first, "cornserve", "tiny-color-vlm"))).toEqual(
      expect.arrayContaining([
        "config.json",
        "preprocessor_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "onnx/vision_encoder.onnx",
        "onnx/audio_encoder.onnx",
        "onnx/embed_tokens.onnx",
        "onnx/decoder_model_merged.onnx"
      ])
    )
    expect((await runCli(["models", "build", "cornserve/tiny-color-vlm", "--dir", second])).code).toBe(0)
    expect(await digest(join(second, "cornserve", "tiny-color-vlm"))).toBe(
      await digest(join(first, "cornserve", "tiny-color-vlm"))
    )
  })

  it("names an unknown model and fails", async () => {
    const dir = await mkdtemp(join(tmpdir(), "cornserve-build-"))
    dirs.push(dir)
    const result = await runCli(["models", "build", "cornserve/no-such-model", "--dir", dir])
    expect(result.code).not.toBe(0)
    expect(result.stderr).toContain("cornserve/no-such-model")
  })
})
