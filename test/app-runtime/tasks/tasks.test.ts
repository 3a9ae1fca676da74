import { afterEach, describe, expect, it } from "vitest"
import {
  type ChatCompletionChunk,
  type ChatCompletionRequest,
  DataForward,
  DisaggregatedMLLMTask,
  EncoderTask,
  type EncoderInput,
  LLMEmbeddingTask,
  LLMTask,
  MLLMTask,
  TaskConfigError,
  TaskInputError,
  TaskStream
} from "../../../src/app-runtime/index.js"
import { distinctUnitTasks } from "../../../src/app-runtime/tasks/Task.js"
import { type DispatchResult, setTaskDispatcher, type TaskGraphWire } from "../../../src/app-runtime/tasks/TaskGraph.js"

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

const model = "Qwen/Qwen2.5-Omni-7B"

/** Catches what `f` throws, failing the test if it throws nothing. */
const thrownBy = (f: () => unknown): Error => {
  try {
    f()
  } catch (error) {
    return error as Error
  }
  throw new Error("expected the call to throw")
}

async function* streamOf<T>(items: ReadonlyArray<T>): AsyncIterable<T> {
  for (const item of items) yield item
}

const collect = async <T>(stream: AsyncIterable<T>): Promise<Array<T>> => {
  const items: Array<T> = []
  for await (const item of stream) items.push(item)
  return items
}

const chunk = (content: string): ChatCompletionChunk => ({
  id: "chatcmpl-1",
  object: "chat.completion.chunk",
  created: 1_700_000_000,
  model,
  choices: [{ index: 0, delta: { content }, finish_reason: null }]
})

interface EncodedForward {
  readonly $dataForward: string
  readonly dataType: string
}

const forwardIds = (forwards: unknown): Array<string> =>
  (forwards as ReadonlyArray<EncodedForward>).map((f) => f.$dataForward)

const invocationAt = (graph: TaskGraphWire, index: number) => {
  const invocation = graph.invocations[index]
  if (invocation === undefined) throw new Error(`the graph has no invocation ${index}`)
  return invocation
}

/**
 * Installs a dispatcher that records every graph it is sent and answers, for each invocation, the
 * output the app recorded (as a real dispatcher wiring DataForwards does), plus `chunks` as the
 * stream of the graph's last task.
 */
const installEchoDispatcher = (chunks: ReadonlyArray<ChatCompletionChunk> = []) => {
  const graphs: Array<TaskGraphWire> = []
  setTaskDispatcher(async (graph) => {
    graphs.push(graph)
    return { outputs: graph.invocations.map((invocation) => invocation.output), stream: streamOf(chunks) }
  })
  return graphs
}

const imageUrl = "https://example.com/cat.png"
const audioBase64 = "UklGRiQAAABXQVZFZm10IBAAAAABAAEA"

const chatWithImageAndAudio: ChatCompletionRequest = {
  messages: [
    {
      role: "user",
      content: [
        { type: "text", text: "What do you see and hear?" },
        { type: "image_url", image_url: { url: imageUrl } },
        { type: "input_audio", input_audio: { data: audioBase64, format: "wav" } }
      ]
    }
  ],
  max_tokens: 64
}

const chatWithImage = (url: string): ChatCompletionRequest => ({
  messages: [
    {
      role: "user",
      content: [
        { type: "text", text: "Describe this image." },
        { type: "image_url", image_url: { url } }
      ]
    }
  ]
})

afterEach(() => {
  setTaskDispatcher(undefined)
})

// ---------------------------------------------------------------------------------------------
// 1. Task identity
// ---------------------------------------------------------------------------------------------

describe("unit task identity", () => {
  it("gives equal configs the same id regardless of key order or spelled-out defaults", () => {
    const plain = new EncoderTask({ model, modality: "image" })
    const reordered = new EncoderTask({ modality: "image", model })
    const withDefault = new EncoderTask({ modality: "image", model, maxBatchSize: 1 })

    expect(reordered.id).toBe(plain.id)
    expect(withDefault.id).toBe(plain.id)
    expect(new LLMTask({ model, receiveEmbeddings: false }).id).toBe(new LLMTask({ model }).id)
  })

  it("prefixes the id with the task kind", () => {
    expect(new EncoderTask({ model, modality: "image" }).id).toMatch(/^encoder-/)
    expect(new LLMTask({ model }).id).toMatch(/^llm-/)
  })

  it("gives a different id for a different model, modality, batch size or kind", () => {
    const base = new EncoderTask({ model, modality: "image" })

    expect(new EncoderTask({ model: "llava-hf/llava-1.5-7b-hf", modality: "image" }).id).not.toBe(base.id)
    expect(new EncoderTask({ model, modality: "audio" }).id).not.toBe(base.id)
    expect(new EncoderTask({ model, modality: "image", maxBatchSize: 8 }).id).not.toBe(base.id)
    expect(new LLMTask({ model }).id).not.toBe(base.id)
    expect(new LLMTask({ model, receiveEmbeddings: true }).id).not.toBe(new LLMTask({ model }).id)
  })

  it("takes executor bounds for rebalancing as part of the config: bounded tasks are deployments of their own", () => {
    const bounded = new LLMTask({ model, minExecutors: 1, maxExecutors: 4 })
    expect(bounded.config).toMatchObject({ minExecutors: 1, maxExecutors: 4 })
    expect(bounded.id).not.toBe(new LLMTask({ model }).id)
    // Absent bounds leave the id as it was: tasks deployed before bounds existed keep theirs.
    expect(new LLMTask({ model }).config).not.toHaveProperty("minExecutors")
    expect(new EncoderTask({ model, modality: "image", maxExecutors: 2 }).config).toMatchObject({ maxExecutors: 2 })
  })

  it("takes an idle time (scale to zero) as part of the config, and an MLLMTask passes it to its encoders and LLM", () => {
    const idle = new LLMTask({ model, idleReleaseS: 60 })
    expect(idle.config).toMatchObject({ idleReleaseS: 60 })
    expect(idle.id).not.toBe(new LLMTask({ model }).id)
    const mllm = new MLLMTask({ model, modalities: ["image"], idleReleaseS: 90 })
    expect(mllm.unitTasks().map((task) => (task.config as { idleReleaseS?: number }).idleReleaseS)).toEqual([90, 90])
    expect(thrownBy(() => new EncoderTask({ model, modality: "image", idleReleaseS: -1 })).message).toContain(
      "idleReleaseS: expected a non-negative number"
    )
  })

  it("gives an LLMTask and an LLMEmbeddingTask with the same config the same id (one executor serves both)", () => {
    expect(new LLMEmbeddingTask({ model }).id).toBe(new LLMTask({ model }).id)
    expect(new LLMEmbeddingTask({ model, receiveEmbeddings: true }).id).toBe(
      new LLMTask({ model, receiveEmbeddings: true }).id
    )
  })

  it("names tasks after the model's last path segment", () => {
    expect(new EncoderTask({ model: "org/My_Model", modality: "video" }).name).toBe("encoder-video-my-model")
    expect(new LLMTask({ model: "org/My_Model" }).name).toBe("llm-my-model")
  })

  describe("rejects an invalid config with a TaskConfigError, one line naming each bad field", () => {
    it("an empty model", () => {
      const error = thrownBy(() => new EncoderTask({ model: "", modality: "image" }))
      expect(error).toBeInstanceOf(TaskConfigError)
      expect(error.message).toMatch(/^ {2}model: /m)
    })

    it("an unknown modality", () => {
      const error = thrownBy(() => new EncoderTask({ model, modality: "smell" as "image" }))
      expect(error).toBeInstanceOf(TaskConfigError)
      expect(error.message).toMatch(/^ {2}modality: expected .*, got "smell"$/m)
    })

    it("an extra unknown key", () => {
      const config = { model, modality: "image", temperature: 0.5 } as unknown as { model: string; modality: "image" }
      const error = thrownBy(() => new EncoderTask(config))
      expect(error).toBeInstanceOf(TaskConfigError)
      expect(error.message).toMatch(/^ {2}temperature: is not a field here \(the fields are /m)
    })

    it("a non-positive or fractional executor bound", () => {
      const error = thrownBy(() => new LLMTask({ model, minExecutors: 0 }))
      expect(error).toBeInstanceOf(TaskConfigError)
      expect(error.message).toMatch(/^ {2}minExecutors: /m)
      expect(thrownBy(() => new EncoderTask({ model, modality: "image", maxExecutors: 1.5 })).message).toMatch(
        /^ {2}maxExecutors: /m
      )
    })

    it("a non-positive batch size", () => {
      const error = thrownBy(() => new EncoderTask({ model, modality: "image", maxBatchSize: 0 }))
      expect(error).toBeInstanceOf(TaskConfigError)
      expect(error.message).toMatch(/^ {2}maxBatchSize: /m)
    })

    it("an unknown key in an LLM or MLLM config", () => {
      const llmError = thrownBy(() => new LLMTask({ model, stream: true } as unknown as { model: string }))
      expect(llmError).toBeInstanceOf(TaskConfigError)
      expect(llmError.message).toMatch(/^ {2}stream: is not a field here/m)

      const mllmError = thrownBy(
        () =>
          new MLLMTask({ model, modalities: ["image"], fission: true } as unknown as { model: string; modalities: [] })
      )
      expect(mllmError).toBeInstanceOf(TaskConfigError)
      expect(mllmError.message).toMatch(/^ {2}fission: is not a field here/m)
    })

    it("bad engine settings, each on its own line, and nothing else", () => {
      const error = thrownBy(
        () =>
          new LLMTask({
            model,
            maxBatchSize: 0,
            kvCacheBytes: -1,
            kvCacheMode: "fast" as "shared",
            prefillChunkTokens: 1.5
          })
      )
      expect(error).toBeInstanceOf(TaskConfigError)
      const lines = error.message.split("\n")
      expect(lines[0]).toBe("invalid llm task config:")
      expect(
        lines
          .slice(1)
          .map((line) => line.trim().split(":")[0])
          .sort()
      ).toEqual(["kvCacheBytes", "kvCacheMode", "maxBatchSize", "prefillChunkTokens"])
      expect(error.message).toMatch(/^ {2}kvCacheMode: expected "shared" or "copies", got "fast"$/m)
      const nested = thrownBy(() => new MLLMTask({ model, modalities: ["image"], llmSettings: { maxBatchSize: 0 } }))
      expect(nested.message).toMatch(/^ {2}llmSettings\.maxBatchSize: /m)
      const share = thrownBy(() => new LLMTask({ model, kvCacheBytes: 1024, prefixCacheBytes: 1024 }))
      expect(share.message).toMatch(/^ {2}prefixCacheBytes: must be less than kvCacheBytes \(1024\)/m)
    })
  })

  describe("engine settings", () => {
    it("are part of the deployment: tasks that differ in them are different tasks", () => {
      const plain = new LLMTask({ model })
      const sized = new LLMTask({ model, maxBatchSize: 4, kvCacheBytes: 64 * 1024 * 1024 })
      expect(sized.id).not.toBe(plain.id)
      expect(new LLMTask({ model, kvCacheBytes: 64 * 1024 * 1024, maxBatchSize: 4 }).id).toBe(sized.id)
      expect(sized.config).toMatchObject({ maxBatchSize: 4, kvCacheBytes: 64 * 1024 * 1024 })
    })

    it("an MLLMTask passes its LLM's and its encoders' on", () => {
      const mllm = new MLLMTask({
        model,
        modalities: ["image"],
        llmSettings: { maxBatchSize: 2, prefixCacheBytes: 0 },
        encoderSettings: { maxBatchSize: 6, preprocessThreads: 3 }
      })
      expect(mllm.llm.config).toMatchObject({ maxBatchSize: 2, prefixCacheBytes: 0 })
      expect(mllm.encoders.get("image")!.config).toMatchObject({ maxBatchSize: 6, preprocessThreads: 3 })
    })
  })
})

// ---------------------------------------------------------------------------------------------
// 2. MLLMTask structure
// ---------------------------------------------------------------------------------------------

describe("MLLMTask", () => {
  it("with encoder fission is one encoder per modality plus an LLM that receives embeddings", () => {
    const mllm = new MLLMTask({ model, modalities: ["image", "audio"], encoderFission: true })
    const units = mllm.unitTasks()

    expect(units).toHaveLength(3)
    const encoders = units.filter((unit): unit is EncoderTask => unit instanceof EncoderTask)
    expect(encoders.map((encoder) => encoder.config.modality).sort()).toEqual(["audio", "image"])
    expect(encoders.every((encoder) => encoder.config.model === model)).toBe(true)

    const llms = units.filter((unit): unit is LLMTask => unit instanceof LLMTask)
    expect(llms).toHaveLength(1)
    expect(llms[0]!.config).toEqual({ model, receiveEmbeddings: true })
  })

  it("defaults to encoder fission", () => {
    const mllm = new MLLMTask({ model, modalities: ["image"] })
    expect(mllm.unitTasks().map((unit) => unit.kind)).toEqual(["encoder", "llm"])
    expect(mllm.llm.config.receiveEmbeddings).toBe(true)
  })

  it("without encoder fission is just the LLM, which does not receive embeddings", () => {
    const mllm = new MLLMTask({ model, modalities: ["image", "audio"], encoderFission: false })
    const units = mllm.unitTasks()

    expect(units).toHaveLength(1)
    expect(units[0]).toBeInstanceOf(LLMTask)
    expect(units[0]!.config).toEqual({ model, receiveEmbeddings: false })
  })

  it("runs its encoders on encoderModel when one is given", () => {
    const mllm = new MLLMTask({ model, modalities: ["image"], encoderModel: "openai/clip-vit-large" })
    expect(mllm.encoders.get("image")!.config.model).toBe("openai/clip-vit-large")
    expect(mllm.llm.config.model).toBe(model)
  })

  it("shares encoder ids between two MLLMTasks with the same model, and distinctUnitTasks dedups them", () => {
    const first = new MLLMTask({ model, modalities: ["image", "audio"] })
    const second = new MLLMTask({ model, modalities: ["audio", "image"] })

    expect(second.encoders.get("image")!.id).toBe(first.encoders.get("image")!.id)
    expect(second.encoders.get("audio")!.id).toBe(first.encoders.get("audio")!.id)
    expect(second.llm.id).toBe(first.llm.id)

    const distinct = distinctUnitTasks([first, second])
    expect(distinct.map((unit) => unit.id)).toEqual(first.unitTasks().map((unit) => unit.id))
    expect(new Set(distinct.map((unit) => unit.id)).size).toBe(3)
  })

  it("shares one encoder among models that name each other in encoderModels: the first sorted runs the tower, the others are its adapters", async () => {
    const [a, b, c] = ["google/gemma-3-12b-it", "google/gemma-3-4b-it", "google/gemma-3-27b-it"]
    const twelve = new MLLMTask({ model: a, modalities: ["image"], encoderModels: [a, b, c] })
    const four = new MLLMTask({ model: b, modalities: ["image"], encoderModels: [c, b, a, b] })
    const encoder = twelve.encoders.get("image")!
    expect(four.encoders.get("image")!.id).toBe(encoder.id)
    expect(encoder.config).toMatchObject({ model: a, adapters: [c, b] })
    expect(encoder.models).toEqual([a, c, b])
    expect(four.llm.id).not.toBe(twelve.llm.id)
    // An encoder given its adapters by hand, in another order and with its own model among them, is the same task.
    expect(new EncoderTask({ model: a, modality: "image", adapters: [b, a, c] }).id).toBe(encoder.id)

    // Each call names its model, so the encoder runs that model's projector.
    const graphs = installEchoDispatcher()
    await four.invoke({
      model: b,
      messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: imageUrl } }] }]
    })
    expect(invocationAt(graphs[0]!, 0).input).toEqual({ urls: [imageUrl], model: b })
    expect(thrownBy(() => encoder.compose({ urls: [imageUrl], model: "google/gemma-3-1b-it" }))).toBeInstanceOf(
      TaskInputError
    )
    expect(thrownBy(() => new MLLMTask({ model: a, modalities: ["image"], encoderModels: [b, c] })).message).toMatch(
      /encoderModels must include the task's model/
    )
    expect(
      thrownBy(() => new MLLMTask({ model: a, modalities: ["image"], encoderModels: [a], encoderModel: b })).message
    ).toMatch(/not both/)
  })

  it("distinctUnitTasks keeps one deployment per id across different tasks, in first-seen order", () => {
    const imageOnly = new MLLMTask({ model, modalities: ["image"] })
    const imageAndVideo = new MLLMTask({ model, modalities: ["image", "video"] })
    const standaloneEncoder = new EncoderTask({ modality: "image", model, maxBatchSize: 1 })

    const distinct = distinctUnitTasks([imageOnly, imageAndVideo, standaloneEncoder])
    expect(distinct.map((unit) => unit.id)).toEqual([
      imageOnly.encoders.get("image")!.id,
      imageOnly.llm.id,
      imageAndVideo.encoders.get("video")!.id
    ])
  })
})

// ---------------------------------------------------------------------------------------------
// 3. Record → dispatch → replay
// ---------------------------------------------------------------------------------------------

describe("invoking a task: record, dispatch, replay", () => {
  it("records an MLLM call as image encoder, audio encoder, then LLM, and dispatches it once", async () => {
    const graphs = installEchoDispatcher()
    const mllm = new MLLMTask({ model, modalities: ["image", "audio"] })

    await mllm.invoke(chatWithImageAndAudio)

    expect(graphs).toHaveLength(1)
    const graph = graphs[0]!
    expect(graph.invocations.map((invocation) => invocation.taskId)).toEqual([
      mllm.encoders.get("image")!.id,
      mllm.encoders.get("audio")!.id,
      mllm.llm.id
    ])
    expect(graph.invocations.map((invocation) => invocation.kind)).toEqual(["encoder", "encoder", "llm"])
    expect(graph.invocations.map((invocation) => invocation.streams)).toEqual([false, false, true])
    expect(invocationAt(graph, 0).config).toEqual({ model, modality: "image", maxBatchSize: 1 })
    expect(invocationAt(graph, 2).config).toEqual({ model, receiveEmbeddings: true })
  })

  it("gives each encoder the url of its part, turning input_audio into a data: url", async () => {
    const graphs = installEchoDispatcher()
    const mllm = new MLLMTask({ model, modalities: ["image", "audio"] })

    await mllm.invoke(chatWithImageAndAudio)

    const graph = graphs[0]!
    expect(invocationAt(graph, 0).input).toEqual({ urls: [imageUrl] })
    expect(invocationAt(graph, 1).input).toEqual({ urls: [`data:audio/wav;base64,${audioBase64}`] })
  })

  it("hands the LLM exactly the DataForwards the encoders produce, in order, as plain JSON", async () => {
    const graphs = installEchoDispatcher()
    const mllm = new MLLMTask({ model, modalities: ["image", "audio"] })

    await mllm.invoke(chatWithImageAndAudio)

    const graph = graphs[0]!
    const imageOutput = invocationAt(graph, 0).output as { embeddings: ReadonlyArray<EncodedForward> }
    const audioOutput = invocationAt(graph, 1).output as { embeddings: ReadonlyArray<EncodedForward> }
    expect(imageOutput.embeddings).toEqual([{ $dataForward: expect.any(String), dataType: "Tensor" }])
    expect(audioOutput.embeddings).toEqual([{ $dataForward: expect.any(String), dataType: "Tensor" }])

    const produced = [...forwardIds(imageOutput.embeddings), ...forwardIds(audioOutput.embeddings)]
    expect(new Set(produced).size).toBe(2)

    const llmInput = invocationAt(graph, 2).input as { cornserveEmbeddings: ReadonlyArray<EncodedForward> }
    expect(forwardIds(llmInput.cornserveEmbeddings)).toEqual(produced)
    expect(llmInput.cornserveEmbeddings.every((forward) => !(forward instanceof DataForward))).toBe(true)
    // The LLM still sees the original messages.
    expect((llmInput as unknown as ChatCompletionRequest).messages).toEqual(chatWithImageAndAudio.messages)

    // The whole graph is plain data: it survives a JSON round trip unchanged.
    expect(JSON.parse(JSON.stringify(graph))).toEqual(graph)
  })

  it("records a disaggregated MLLM call as encoder, prefill, decode: the prefill sends the embeddings on under ids of its own", async () => {
    const graphs = installEchoDispatcher()
    const mllm = new DisaggregatedMLLMTask({ model, modalities: ["image"] })

    await mllm.invoke(chatWithImage(imageUrl))

    const graph = graphs[0]!
    expect(graph.invocations.map((invocation) => invocation.taskId)).toEqual([
      mllm.encoders.get("image")!.id,
      mllm.llm.prefill.id,
      mllm.llm.decode.id
    ])
    expect(graph.invocations.map((invocation) => invocation.operation)).toEqual(["embed", "kv-prefill", "chat"])
    const encoded = forwardIds((invocationAt(graph, 0).output as { embeddings: unknown }).embeddings)
    const prefill = invocationAt(graph, 1)
    expect(forwardIds((prefill.input as { cornserveEmbeddings: unknown }).cornserveEmbeddings)).toEqual(encoded)
    const sent = prefill.output as { kv: EncodedForward; embeddings: ReadonlyArray<EncodedForward> }
    expect(sent.embeddings).toHaveLength(1)
    const decode = invocationAt(graph, 2).input as { cornserveEmbeddings: unknown; cornserveKv: EncodedForward }
    // Each datum has one producer and one consumer: the decode task reads the prefill task's copies.
    expect(forwardIds(decode.cornserveEmbeddings)).toEqual(forwardIds(sent.embeddings))
    expect(forwardIds(decode.cornserveEmbeddings)).not.toEqual(encoded)
    expect(decode.cornserveKv.$dataForward).toBe(sent.kv.$dataForward)
    expect(mllm.name).toBe(`mllm-disaggregated-${mllm.llm.prefill.config.model.split("/").at(-1)!.toLowerCase()}`)
  })

  it("returns a TaskStream that yields exactly the chunks the dispatcher streams", async () => {
    const chunks = [chunk("A cat"), chunk(" meowing"), chunk(".")]
    installEchoDispatcher(chunks)
    const mllm = new MLLMTask({ model, modalities: ["image", "audio"] })

    const stream = await mllm.invoke(chatWithImageAndAudio)

    expect(stream).toBeInstanceOf(TaskStream)
    expect(stream.isPlaceholder).toBe(false)
    expect(await collect(stream)).toEqual(chunks)
  })

  it("without encoder fission dispatches the LLM alone with the media left in the messages", async () => {
    const graphs = installEchoDispatcher([chunk("hi")])
    const mllm = new MLLMTask({ model, modalities: ["image", "audio"], encoderFission: false })

    const stream = await mllm.invoke(chatWithImageAndAudio)

    const graph = graphs[0]!
    expect(graph.invocations).toHaveLength(1)
    expect(invocationAt(graph, 0).taskId).toBe(mllm.llm.id)
    expect(invocationAt(graph, 0).streams).toBe(true)
    expect(invocationAt(graph, 0).input).not.toHaveProperty("cornserveEmbeddings")
    expect(await collect(stream)).toEqual([chunk("hi")])
  })

  it("replays the task over the outputs the dispatcher answers", async () => {
    const encoder = new EncoderTask({ model, modality: "image" })
    setTaskDispatcher(async () => ({
      outputs: [{ embeddings: [{ $dataForward: "answered-id", dataType: "Tensor" }] }]
    }))

    const output = await encoder.invoke({ urls: [imageUrl] })

    expect(output.embeddings).toHaveLength(1)
    expect(output.embeddings[0]).toBeInstanceOf(DataForward)
    expect(output.embeddings[0]!.id).toBe("answered-id")
    expect(output.embeddings[0]!.dataType).toBe("Tensor")
  })

  it("rejects with a clear message when no dispatcher is installed", async () => {
    setTaskDispatcher(undefined)
    const mllm = new MLLMTask({ model, modalities: ["image", "audio"] })

    await expect(mllm.invoke(chatWithImageAndAudio)).rejects.toThrow(
      "task.invoke() runs only inside a registered app's serve()"
    )
  })

  it("rejects a media part of a modality the MLLM does not take, naming the modalities", async () => {
    const graphs = installEchoDispatcher()
    const mllm = new MLLMTask({ model, modalities: ["image"] })
    const withVideo: ChatCompletionRequest = {
      messages: [
        {
          role: "user",
          content: [
            { type: "text", text: "What happens here?" },
            { type: "video_url", video_url: { url: "https://example.com/clip.mp4" } }
          ]
        }
      ]
    }

    const failure = mllm.invoke(withVideo)

    await expect(failure).rejects.toBeInstanceOf(TaskInputError)
    await expect(failure).rejects.toThrow(/takes image; the request has video/)
    expect(graphs).toHaveLength(0)
  })

  it("rejects an encoder input with no urls with a TaskInputError, before dispatching", async () => {
    const graphs = installEchoDispatcher()
    const encoder = new EncoderTask({ model, modality: "image" })

    const failure = encoder.invoke({ urls: [] } as unknown as EncoderInput)

    await expect(failure).rejects.toBeInstanceOf(TaskInputError)
    await expect(failure).rejects.toThrow(encoder.id)
    expect(graphs).toHaveLength(0)
  })

  it("keeps concurrent invokes apart: each gets its own graph and its own outputs", async () => {
    // Each dispatch waits until the test answers it, so both graphs are recorded before either
    // is answered, and the answers arrive in the opposite order.
    const pending: Array<{ graph: TaskGraphWire; answer: (result: DispatchResult) => void }> = []
    let bothRecorded!: () => void
    const recorded = new Promise<void>((resolve) => (bothRecorded = resolve))
    setTaskDispatcher(
      (graph) =>
        new Promise<DispatchResult>((answer) => {
          pending.push({ graph, answer })
          if (pending.length === 2) bothRecorded()
        })
    )
    const mllm = new MLLMTask({ model, modalities: ["image"] })
    const catUrl = "https://example.com/cat.png"
    const dogUrl = "https://example.com/dog.png"

    const cat = mllm.invoke(chatWithImage(catUrl))
    const dog = mllm.invoke(chatWithImage(dogUrl))
    await recorded

    const urlOf = (graph: TaskGraphWire) => (invocationAt(graph, 0).input as { urls: Array<string> }).urls[0]
    expect(pending.map(({ graph }) => urlOf(graph))).toEqual([catUrl, dogUrl])
    for (const { graph } of pending) expect(graph.invocations).toHaveLength(2)
    const [catForward, dogForward] = pending.map(({ graph }) =>
      forwardIds((invocationAt(graph, 0).output as { embeddings: unknown }).embeddings)
    )
    expect(catForward).not.toEqual(dogForward)

    for (const { graph, answer } of [...pending].reverse()) {
      answer({
        outputs: graph.invocations.map((invocation) => invocation.output),
        stream: streamOf([chunk(`about ${urlOf(graph)}`)])
      })
    }

    const [catStream, dogStream] = await Promise.all([cat, dog])
    expect(await collect(catStream)).toEqual([chunk(`about ${catUrl}`)])
    expect(await collect(dogStream)).toEqual([chunk(`about ${dogUrl}`)])
  })

  it("keeps the outputs of concurrent unit-task invokes apart", async () => {
    setTaskDispatcher(async (graph) => ({
      outputs: graph.invocations.map((invocation) => ({
        embeddings: [
          { $dataForward: `for ${(invocation.input as { urls: Array<string> }).urls[0]}`, dataType: "Tensor" }
        ]
      }))
    }))
    const encoder = new EncoderTask({ model, modality: "image" })

    const [a, b] = await Promise.all([encoder.invoke({ urls: ["a.png"] }), encoder.invoke({ urls: ["b.png"] })])

    expect(a.embeddings[0]!.id).toBe("for a.png")
    expect(b.embeddings[0]!.id).toBe("for b.png")
  })
})
