import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { paddedPositions, piecePositions, promptPositions } from "../../src/executors/llm/PositionIds.js"
import { loadModelDirectory } from "../../src/models/ModelDirectory.js"

/**
 * What the platform reads of a Gemma 3 config as Google writes it: a text_config that holds only
 * what differs from Gemma3TextConfig's defaults (no vocabulary size, no head counts), the image
 * token named image_token_index, and positions that count from 1 (transformers.js feeds Gemma 3's
 * and PaliGemma's decoders so); other decoders count from 0.
 */

let root: string

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-gemma3-config-"))
})

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

const directory = async (name: string, config: Record<string, unknown>) => {
  const dir = join(root, name)
  await mkdir(join(dir, "onnx"), { recursive: true })
  await writeFile(join(dir, "config.json"), JSON.stringify(config))
  await writeFile(join(dir, "onnx", "decoder_model_merged.onnx"), "")
  return loadModelDirectory(dir)
}

/** google/gemma-3-4b-it's config.json, as published. */
const gemma3 = {
  architectures: ["Gemma3ForConditionalGeneration"],
  boi_token_index: 255999,
  eoi_token_index: 256000,
  eos_token_id: [1, 106],
  image_token_index: 262144,
  initializer_range: 0.02,
  mm_tokens_per_image: 256,
  model_type: "gemma3",
  text_config: {
    hidden_size: 2560,
    intermediate_size: 10240,
    model_type: "gemma3_text",
    num_hidden_layers: 34,
    rope_scaling: { factor: 8.0, rope_type: "linear" },
    sliding_window: 1024
  },
  vision_config: {
    hidden_size: 1152,
    image_size: 896,
    intermediate_size: 4304,
    model_type: "siglip_vision_model",
    num_attention_heads: 16,
    num_hidden_layers: 27,
    patch_size: 14,
    vision_use_head: false
  }
}

describe("a Gemma 3 config", () => {
  it("fills Gemma3TextConfig's defaults under what its text_config gives, and counts positions from 1", async () => {
    const model = await directory("gemma-3-4b-it", gemma3)
    expect(model.decoder).toEqual({
      hiddenSize: 2560,
      layers: 34,
      heads: 8,
      keyValueHeads: 4,
      headDim: 256,
      vocabSize: 262208,
      maxPositions: 131072,
      slidingWindow: 1024,
      firstPosition: 1
    })
    expect(model.config.image_token_id).toBe(262144)
  })

  it("counts a text-only Gemma 3's positions from 1 too, and a Llama's from 0", async () => {
    const text = await directory("gemma-3-1b-it", {
      model_type: "gemma3_text",
      hidden_size: 1152,
      num_hidden_layers: 26,
      num_attention_heads: 4,
      num_key_value_heads: 1,
      head_dim: 256,
      vocab_size: 262144,
      sliding_window: 512
    })
    expect(text.decoder).toMatchObject({ vocabSize: 262144, heads: 4, slidingWindow: 512, firstPosition: 1 })
    const llama = await directory("llama", {
      model_type: "llama",
      hidden_size: 64,
      num_hidden_layers: 2,
      num_attention_heads: 4,
      vocab_size: 100
    })
    expect(llama.decoder?.firstPosition).toBe(0)
  })

  it("gives the ids transformers.js does: a prompt from 1, padding at 1, decode steps after the prompt's last", () => {
    const prompt = { inputIds: Int32Array.of(5, 6, 7), media: [] }
    const located = promptPositions(prompt, 1, 1)
    expect(Array.from(piecePositions(located, 0, 3, 1), Number)).toEqual([1, 2, 3])
    expect(located.delta).toBe(1)
    // Two prompts, the shorter left-padded: its padding takes position 1, as transformers.js gives masked positions.
    const short = promptPositions({ inputIds: Int32Array.of(9), media: [] }, 1, 1)
    expect(
      Array.from(
        paddedPositions(
          [
            { located, length: 3 },
            { located: short, length: 1 }
          ],
          3,
          1
        ),
        Number
      )
    ).toEqual([1, 2, 3, 1, 1, 1])
    // From 0 as before for every other decoder.
    expect(Array.from(piecePositions(promptPositions(prompt, 1), 0, 3, 1), Number)).toEqual([0, 1, 2])
  })
})
