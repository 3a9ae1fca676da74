import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { AutoModelForVision2Seq, AutoProcessor, type Message, RawImage, type Tensor } from "@huggingface/transformers"
import OpenAI from "openai"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { llamaGraphs } from "../../src/models/architectures/Llama.js"
import { Graph } from "../../src/models/onnx/Graph.js"
import { smolVlmFixture, writeModelFiles } from "../models/support/SmolVlmFixture.js"
import { offline } from "../models/support/TransformersJs.js"
import { type RunningPlatform, runCli, startPlatform } from "../support/platform.js"
import { gradientPng, mllmAppSource } from "../support/mllmApps.js"

/**
 * SmolVLM (Idefics3) in the layout onnx-community publishes, served end to end by the real binary:
 * the encoder in Eric with the features sent through the sidecar (encoder fission), or the LLM
 * executor running the vision encoder itself; both answer what transformers.js's
 * Idefics3ForConditionalGeneration answers for the same image and question.
 */

const maxTokens = 12

describe("SmolVLM (Idefics3) end to end", () => {
  let root: string
  let model: string
  let platform: RunningPlatform
  const images = new Map<string, Buffer>()

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-smolvlm-"))
    model = join(root, "tiny-smolvlm")
    const base = smolVlmFixture()
    const config = JSON.parse(new TextDecoder().decode(base.files.get("config.json")!)) as {
      text_config: Record<string, number>
    }
    const text = config.text_config
    const language = llamaGraphs(
      {
        hiddenSize: text.hidden_size!,
        intermediateSize: text.intermediate_size!,
        layers: text.num_hidden_layers!,
        heads: text.num_attention_heads!,
        kvHeads: text.num_key_value_heads!,
        headDim: text.head_dim!,
        vocabSize: text.vocab_size!,
        maxPositions: 1024,
        ropeTheta: text.rope_theta!,
        rmsNormEps: text.rms_norm_eps!
      },
      { layout: "split", dtype: "fp32", positionIds: true, pastPrefix: "past_key_values", seed: 5, std: 0.5 },
      (name) => new Graph(name)
    )
    await writeModelFiles(
      model,
      new Map([...base.files, ...[...language].map(([stem, graph]) => [`onnx/${stem}.onnx`, graph.toBytes()] as const)])
    )
    // A wide image (split into tiles) and a small one (one tile).
    images.set("wide", await gradientPng(150, 60))
    images.set("small", await gradientPng(20, 24))
    // The model is a directory of the test's own: the operator allows its root for tasks to name.
    platform = await startPlatform({ args: ["--devices", "cpu:0,cpu:1,cpu:2", "--model-root", root] })
    for (const fission of [true, false]) {
      const file = join(root, `smolvlm_${fission ? "fission" : "local"}.ts`)
      await writeFile(file, mllmAppSource(model, ["image"], fission))
      const registered = await runCli(["app", "register", file], { CORNSERVE_GATEWAY_URL: platform.url })
      expect(registered.code, registered.stderr).toBe(0)
    }
  })

  afterAll(async () => {
    await platform?.stop()
    await rm(root, { recursive: true, force: true })
  })

  /** transformers.js's greedy answer to the question about `image`. */
  const reference = async (image: Buffer, question: string): Promise<string> => {
    const id = offline(model)
    const processor = await AutoProcessor.from_pretrained(id)
    const vlm = await AutoModelForVision2Seq.from_pretrained(id, { dtype: "fp32" })
    try {
      const messages: Array<Message> = [
        { role: "user", content: [{ type: "image" }, { type: "text", text: question }] as never }
      ]
      const prompt = processor.apply_chat_template(messages, { add_generation_prompt: true }) as string
      const inputs = await processor(prompt, [await RawImage.fromBlob(new Blob([image]))])
      const output = (await vlm.generate({ ...inputs, max_new_tokens: maxTokens, do_sample: false })) as Tensor
      const length = (inputs.input_ids as Tensor).dims[1]!
      const generated = Array.from(output.data as BigInt64Array, Number).slice(length)
      return processor.tokenizer!.decode(generated, { skip_special_tokens: true })
    } finally {
      await vlm.dispose()
    }
  }

  const ask = async (app: string, image: Buffer, question: string) => {
    const client = new OpenAI({ baseURL: `${platform.url}/app/${app}/v1`, apiKey: "unused" })
    const completion = await client.chat.completions.create({
      model,
      messages: [
        {
          role: "user",
          content: [
            { type: "image_url", image_url: { url: `data:image/png;base64,${image.toString("base64")}` } },
            { type: "text", text: question }
          ]
        }
      ],
      max_tokens: maxTokens,
      temperature: 0
    })
    return completion.choices[0]!.message.content
  }

  it.each(["wide", "small"])(
    "a %s image: the same answer with encoder fission, without it, and from transformers.js",
    async (name) => {
      const image = images.get(name)!
      const question = " What is in this image?"
      const expected = await reference(image, question)
      expect(expected.length).toBeGreaterThan(0)
      expect(await ask("smolvlm_fission", image, question)).toBe(expected)
      expect(await ask("smolvlm_local", image, question)).toBe(expected)
    }
  )

  it("the image reaches the model: two images, two answers", async () => {
    const question = " What is in this image?"
    const answers = await Promise.all(
      ["wide", "small"].map((name) => ask("smolvlm_fission", images.get(name)!, question))
    )
    expect(answers[0]).not.toBe(answers[1])
  })
})
