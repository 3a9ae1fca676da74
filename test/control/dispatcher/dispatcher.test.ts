import { getEventListeners } from "node:events"
import { Effect, ManagedRuntime } from "effect"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { type ChatCompletionRequest, MLLMTask } from "../../../src/app-runtime/index.js"
import {
  setTaskDispatcher,
  type TaskGraphWire,
  type TaskInvocationWire
} from "../../../src/app-runtime/tasks/TaskGraph.js"
import { makeDispatch, wireDataForwards } from "../../../src/control/dispatcher/Dispatcher.js"
import { datumReceivers, receiversOf } from "../../../src/control/dispatcher/DataWiring.js"
import { BusyClock } from "../../../src/metrics/BusyClock.js"
import { TaskManagers } from "../../../src/control/task-manager/TaskManagers.js"
import { answerJson, cpuGroups, refuse, StandInExecutor, standInKind } from "../../support/standInExecutors.js"

/** A forwarded datum as it appears in a wire graph. */
const forward = (id: string) => ({ $dataForward: id, dataType: "Tensor" })

const encoderCall = (taskId: string, produces: ReadonlyArray<string>): TaskInvocationWire => ({
  taskId,
  kind: "encoder",
  operation: "embed",
  config: { model: "m", modality: "image", maxBatchSize: 1 },
  input: { urls: produces.map((id) => `https://example.com/${id}.png`) },
  output: { embeddings: produces.map(forward) },
  streams: false
})

const llmCall = (taskId: string, consumes: ReadonlyArray<string>): TaskInvocationWire => ({
  taskId,
  kind: "llm",
  operation: "chat",
  config: { model: "m", receiveEmbeddings: true },
  input: { messages: [{ role: "user", content: "hi" }], cornserveEmbeddings: consumes.map(forward) },
  output: {},
  streams: true
})

const graphOf = (first: TaskInvocationWire, ...rest: Array<TaskInvocationWire>): TaskGraphWire => ({
  invocations: [first, ...rest]
})

describe("wireDataForwards", () => {
  it("wires each produced datum from its producer to its consumers", () => {
    const graph = graphOf(encoderCall("encoder-a", ["img1"]), llmCall("llm-b", ["img1"]))

    expect(wireDataForwards(graph)).toEqual([{ id: "img1", producer: 0, consumers: [1] }])
  })

  it("wires several data, including one datum consumed by several tasks", () => {
    const graph = graphOf(
      encoderCall("encoder-image", ["img1", "img2"]),
      encoderCall("encoder-audio", ["aud1"]),
      llmCall("llm-first", ["img1", "aud1"]),
      llmCall("llm-second", ["img2", "img1"])
    )

    const wiring = wireDataForwards(graph)

    expect(wiring).toEqual(
      expect.arrayContaining([
        { id: "img1", producer: 0, consumers: [2, 3] },
        { id: "img2", producer: 0, consumers: [3] },
        { id: "aud1", producer: 1, consumers: [2] }
      ])
    )
    expect(wiring).toHaveLength(3)
  })

  it("names a datum's node once for each of its consumers there, so that the sidecar keeps it for each", () => {
    const graph = graphOf(
      encoderCall("encoder-image", ["img1", "img2"]),
      encoderCall("encoder-audio", ["aud1"]),
      llmCall("llm-first", ["img1", "aud1"]),
      llmCall("llm-second", ["img2", "img1"])
    )
    const wiring = wireDataForwards(graph)
    if (typeof wiring === "string") throw new Error(wiring)
    // The LLMs on two nodes, then on one.
    const apart = (index: number) => (index === 3 ? "node-b" : "node-a")
    expect(datumReceivers(wiring, "img1", apart)).toEqual(["node-a", "node-b"])
    expect(datumReceivers(wiring, "img2", apart)).toEqual(["node-b"])
    const together = () => "node-a"
    expect(datumReceivers(wiring, "img1", together)).toEqual(["node-a", "node-a"])
    expect(datumReceivers(wiring, "img2", together)).toEqual(["node-a"])
    // The encoder's call as a whole: as many as its most-read datum has (each item gets its own).
    expect(receiversOf(wiring, 0, together, "node-a")).toEqual(["node-a", "node-a"])
    expect(receiversOf(wiring, 1, together, "node-a")).toEqual(["node-a"])
    // An invocation that forwards nothing: its own node.
    expect(receiversOf(wiring, 3, together, "node-c")).toEqual(["node-c"])
  })

  it("answers an empty wiring for a graph that forwards nothing", () => {
    expect(wireDataForwards(graphOf(llmCall("llm-only", [])))).toEqual([])
  })

  it("refuses a consumer of data that no task produced, naming the task and the datum", () => {
    const graph = graphOf(encoderCall("encoder-a", ["img1"]), llmCall("llm-b", ["img1", "ghost"]))

    const wiring = wireDataForwards(graph)

    expect(typeof wiring).toBe("string")
    expect(wiring).toContain("llm-b")
    expect(wiring).toContain("ghost")
  })

  it("refuses a consumer placed before the producer of its data", () => {
    const graph = graphOf(llmCall("llm-b", ["img1"]), encoderCall("encoder-a", ["img1"]))

    const wiring = wireDataForwards(graph)

    expect(typeof wiring).toBe("string")
    expect(wiring).toContain("llm-b")
    expect(wiring).toContain("img1")
  })

  it("refuses produced data that nothing consumes, naming the producer and the datum", () => {
    const graph = graphOf(encoderCall("encoder-a", ["img1", "orphan"]), llmCall("llm-b", ["img1"]))

    const wiring = wireDataForwards(graph)

    expect(typeof wiring).toBe("string")
    expect(wiring).toContain("encoder-a")
    expect(wiring).toContain("orphan")
  })

  describe("on a graph recorded by an MLLM invoke", () => {
    afterEach(() => {
      setTaskDispatcher(undefined)
    })

    it("wires each encoder's embedding to the LLM", async () => {
      const graphs: Array<TaskGraphWire> = []
      setTaskDispatcher(async (graph) => {
        graphs.push(graph)
        return { outputs: graph.invocations.map((invocation) => invocation.output) }
      })
      const mllm = new MLLMTask({ model: "Qwen/Qwen2.5-Omni-7B", modalities: ["image", "audio"] })
      const request: ChatCompletionRequest = {
        messages: [
          {
            role: "user",
            content: [
              { type: "image_url", image_url: { url: "https://example.com/cat.png" } },
              { type: "audio_url", audio_url: { url: "https://example.com/meow.wav" } }
            ]
          }
        ]
      }

      await mllm.invoke(request)

      const wiring = wireDataForwards(graphs[0]!)
      expect(typeof wiring).not.toBe("string")
      expect(wiring).toEqual([
        { id: expect.any(String), producer: 0, consumers: [2] },
        { id: expect.any(String), producer: 1, consumers: [2] }
      ])
    })
  })
})

describe("Dispatcher.dispatch, against stand-in executors", () => {
  const runtime = ManagedRuntime.make(TaskManagers.Default)
  const encoders: Array<StandInExecutor> = []
  let llm: StandInExecutor
  const released: Array<ReadonlyArray<string>> = []
  let dispatch: ReturnType<typeof makeDispatch>

  const chunk = (content: string) => ({
    id: "chatcmpl-1",
    object: "chat.completion.chunk",
    created: 1,
    model: "m",
    choices: [{ index: 0, delta: { content }, finish_reason: null, logprobs: null }]
  })

  /** The LLM stand-in streams two chunks once the encoder has answered. */
  const streamChat = (response: import("node:http").ServerResponse) => {
    response.writeHead(200, { "content-type": "text/event-stream" })
    response.end(`data: ${JSON.stringify(chunk("re"))}\n\ndata: ${JSON.stringify(chunk("d"))}\n\ndata: [DONE]\n\n`)
  }

  const embedded = (body: unknown) => ({
    items: (body as { items: Array<{ id: string; modality: string }> }).items.map((item) => ({
      id: item.id,
      modality: item.modality,
      dtype: "float32",
      shape: [4, 8]
    }))
  })

  const requestSignal = () => new AbortController().signal

  beforeAll(async () => {
    encoders.push(await StandInExecutor.start(), await StandInExecutor.start())
    llm = await StandInExecutor.start()
    const managers = await runtime.runPromise(TaskManagers)
    await runtime.runPromise(
      Effect.all([
        managers.deploy(
          { id: "encoder-a", kind: "encoder", name: "encoder", config: {} },
          standInKind("encoder", encoders),
          cpuGroups(2, "node-test")
        ),
        managers.deploy(
          { id: "llm-b", kind: "llm", name: "llm", config: {} },
          standInKind("llm", [llm]),
          cpuGroups(1, "node-test")
        )
      ])
    )
    dispatch = makeDispatch({
      task: managers.get,
      release: (ids) => void released.push(ids),
      sidecarRunning: async () => true,
      onSidecarLost: () => () => undefined
    })
  })

  afterEach(() => {
    for (const standIn of [...encoders, llm]) {
      standIn.received.length = 0
      standIn.health = 200
    }
    released.length = 0
  })

  afterAll(async () => {
    await runtime.dispose()
    await Promise.all([...encoders, llm].map((standIn) => standIn.close()))
  })

  const graph = graphOf(encoderCall("encoder-a", ["img1"]), llmCall("llm-b", ["img1"]))
  /** The id the LLM's `n`-th call was told its embedding has. */
  const llmEmbeddingId = (n: number) =>
    (llm.received[n]!.body as { cornserve_embeddings: Array<{ id: string }> }).cornserve_embeddings[0]!.id

  it("sends every invocation at once and streams the last one's chunks", async () => {
    let llmArrived: () => void = () => undefined
    const llmSeen = new Promise<void>((resolve) => (llmArrived = resolve))
    for (const encoder of encoders) {
      // The encoder answers only once the LLM's request has arrived: the calls run side by side.
      encoder.handle = (request, response) => void llmSeen.then(() => answerJson(response, embedded(request.body)))
    }
    llm.handle = (_, response) => {
      llmArrived()
      streamChat(response)
    }

    const outcome = await dispatch(graph, "request-1", requestSignal())

    const text: Array<string> = []
    for await (const piece of outcome.stream!) text.push((piece as ReturnType<typeof chunk>).choices[0]!.delta.content)
    expect(text.join("")).toBe("red")
    const embedRequest = encoders.flatMap((encoder) => encoder.received)[0]!
    // The data goes under an id of the platform's own, never the one the app named (an app is
    // hostile code: it could name another app's), the same for its producer and its consumer.
    const sent = (embedRequest.body as { items: Array<{ id: string }> }).items[0]!.id
    expect(sent).not.toBe("img1")
    expect(sent).toMatch(/^[0-9a-f]{32}$/)
    expect(embedRequest.body).toEqual({
      items: [{ id: sent, modality: "image", url: "https://example.com/img1.png", receivers: ["node-test"] }],
      receivers: ["node-test"],
      return: "sidecar"
    })
    expect(llm.received[0]!.body).toMatchObject({
      model: "m",
      stream: true,
      cornserve_embeddings: [{ id: sent, modality: "image" }]
    })
    expect(outcome.outputs[0]).toEqual({ embeddings: [forward("img1")] })
  })

  it("cancels the other invocations when one fails, with the input's fault as TaskInputRejected", async () => {
    let llmArrived: () => void = () => undefined
    const llmSeen = new Promise<void>((resolve) => (llmArrived = resolve))
    // The encoder refuses once the LLM's call is under way: that call is then cancelled.
    for (const encoder of encoders)
      encoder.handle = (_, response) => void llmSeen.then(() => refuse(response, 400, "MediaError", "not an image"))
    llm.handle = () => llmArrived()

    await expect(dispatch(graph, "request-2", requestSignal())).rejects.toMatchObject({
      _tag: "TaskInputRejected",
      message: "task encoder-a: not an image"
    })
    await expect(llm.received[0]!.abandoned).resolves.toBe(true)
    expect(released).toEqual([[llmEmbeddingId(0)]])
  })

  it("fails with DispatchFailed, not an input error, when an executor fails on its own", async () => {
    for (const encoder of encoders)
      encoder.handle = (_, response) => refuse(response, 500, "ExecutorFailed", "worker 0 failed")
    llm.handle = () => undefined

    await expect(dispatch(graph, "request-3", requestSignal())).rejects.toMatchObject({
      _tag: "DispatchFailed",
      message: "task encoder-a: ExecutorFailed: worker 0 failed"
    })
  })

  it("runs the graph once more under fresh data ids when its encoder is unavailable, never the same ids twice", async () => {
    // Whichever executor gets the first call is full; the graph is tried again, every invocation
    // under new ids: a producer's second try under the first ids could find its chunks already sent.
    let first = true
    for (const encoder of encoders) {
      encoder.handle = (request, response) => {
        if (first) {
          first = false
          return refuse(response, 503, "EngineUnavailable", "the executor's queue is full")
        }
        answerJson(response, embedded(request.body))
      }
    }
    llm.handle = (_, response) => streamChat(response)

    const outcome = await dispatch(graph, "request-4", requestSignal())
    for await (const _ of outcome.stream!) {
      // drained
    }

    const embedIds = encoders
      .flatMap((encoder) => encoder.received)
      .map((request) => (request.body as { items: Array<{ id: string }> }).items[0]!.id)
    expect(embedIds).toHaveLength(2)
    expect(embedIds).not.toContain("img1")
    expect(embedIds[1]).not.toBe(embedIds[0])
    const llmIds = llm.received.map(
      (request) => (request.body as { cornserve_embeddings: Array<{ id: string }> }).cornserve_embeddings[0]!.id
    )
    expect(llmIds.at(-1)).toBe(embedIds[1])
    expect(outcome.outputs[0]).toEqual({ embeddings: [forward("img1")] })
  })

  it("runs a graph once more as a whole, under fresh data ids, when its LLM is unavailable before it answers", async () => {
    for (const encoder of encoders) encoder.handle = (request, response) => answerJson(response, embedded(request.body))
    let tries = 0
    llm.handle = (_, response) => {
      tries++
      if (tries === 1) return refuse(response, 503, "EngineUnavailable", "the executor's node is going away")
      streamChat(response)
    }

    const outcome = await dispatch(graph, "request-7", requestSignal())
    const text: Array<string> = []
    for await (const piece of outcome.stream!) text.push((piece as ReturnType<typeof chunk>).choices[0]!.delta.content)

    expect(text.join("")).toBe("red")
    const embedIds = encoders
      .flatMap((encoder) => encoder.received)
      .map((request) => (request.body as { items: Array<{ id: string }> }).items[0]!.id)
    const llmIds = llm.received.map(
      (request) => (request.body as { cornserve_embeddings: Array<{ id: string }> }).cornserve_embeddings[0]!.id
    )
    expect(embedIds).toHaveLength(2)
    expect(embedIds).not.toContain("img1")
    expect(embedIds[1]).not.toBe(embedIds[0])
    expect(llmIds).toEqual(embedIds)
    // The first try's data is released; the app sees its own ids in the outputs.
    expect(released).toEqual([[embedIds[0]]])
    expect(outcome.outputs[0]).toEqual({ embeddings: [forward("img1")] })
  })

  it("runs a graph as a whole once more only: unavailable twice is the client's 503", async () => {
    for (const encoder of encoders) encoder.handle = (request, response) => answerJson(response, embedded(request.body))
    llm.handle = (_, response) => refuse(response, 503, "EngineUnavailable", "the executor's queue is full")

    await expect(dispatch(graph, "request-8", requestSignal())).rejects.toMatchObject({ _tag: "TaskUnavailable" })
    expect(llm.received).toHaveLength(2)
  })

  it("does not run a graph again for an input the executor refused", async () => {
    for (const encoder of encoders) encoder.handle = (request, response) => answerJson(response, embedded(request.body))
    llm.handle = (_, response) => refuse(response, 400, "BadRequest", "too many tokens")

    await expect(dispatch(graph, "request-9", requestSignal())).rejects.toMatchObject({ _tag: "TaskInputRejected" })
    expect(llm.received).toHaveLength(1)
  })

  it("releases the graph's forwarded data when the request is cancelled", async () => {
    for (const encoder of encoders) encoder.handle = () => undefined
    llm.handle = () => undefined
    const request = new AbortController()

    const outcome = dispatch(graph, "request-5", request.signal)
    await new Promise((resolve) => setTimeout(resolve, 100))
    request.abort()

    await expect(outcome).rejects.toMatchObject({ _tag: "RequestCancelled" })
    expect(released).toEqual([[llmEmbeddingId(0)]])
    await expect(llm.received[0]!.abandoned).resolves.toBe(true)
  })

  it("leaves no listener on its executors' lease signals, whether a call succeeded, failed or was cancelled", async () => {
    for (const encoder of encoders) encoder.handle = (request, response) => answerJson(response, embedded(request.body))
    llm.handle = (_, response) => streamChat(response)
    for (let round = 0; round < 3; round++) {
      const outcome = await dispatch(graph, `request-ok-${round}`, requestSignal())
      for await (const _ of outcome.stream!) {
        // drained
      }
    }
    for (const encoder of encoders) encoder.handle = (_, response) => refuse(response, 400, "MediaError", "bad")
    await expect(dispatch(graph, "request-bad", requestSignal())).rejects.toMatchObject({ _tag: "TaskInputRejected" })
    llm.handle = () => undefined
    for (const encoder of encoders) encoder.handle = () => undefined
    const request = new AbortController()
    const cancelled = dispatch(graph, "request-cancelled", request.signal).catch(() => undefined)
    await new Promise((resolve) => setTimeout(resolve, 50))
    request.abort()
    await cancelled

    const managers = await runtime.runPromise(TaskManagers)
    const signals: Array<AbortSignal> = []
    for (const [taskId, executors] of [
      ["encoder-a", 2],
      ["llm-b", 1]
    ] as const) {
      const seen: Array<string> = []
      for (let index = 0; index < executors; index++) {
        const lease = await managers.get(taskId)!.lease({ ...(seen.length > 0 ? { exclude: seen[0] } : {}) })
        seen.push(lease.executorId)
        signals.push(lease.signal)
        lease.release("ok")
      }
    }
    expect(signals.map((signal) => getEventListeners(signal, "abort").length)).toEqual([0, 0, 0])
  })

  it("reports each executor call, the stream's first chunk and the gaps between its chunks", async () => {
    for (const encoder of encoders) encoder.handle = (request, response) => answerJson(response, embedded(request.body))
    llm.handle = (_, response) => streamChat(response)
    const seen: Array<string> = []
    const managers = await runtime.runPromise(TaskManagers)
    const observed = makeDispatch({
      task: managers.get,
      release: () => undefined,
      sidecarRunning: async () => true,
      onSidecarLost: () => () => undefined,
      observer: {
        call: (taskId, operation, outcome, seconds) => {
          expect(seconds).toBeGreaterThanOrEqual(0)
          seen.push(`call ${taskId} ${operation} ${outcome}`)
        },
        firstChunk: (taskId) => seen.push(`first ${taskId}`),
        nextChunk: (taskId) => seen.push(`next ${taskId}`),
        leaseWait: (taskId) => seen.push(`lease ${taskId}`),
        retried: (reason) => seen.push(`retried ${reason}`),
        failover: (taskId) => seen.push(`failover ${taskId}`)
      }
    })
    const timing = { dispatches: new BusyClock(), executors: new BusyClock() }
    const began = performance.now()
    const outcome = await observed(graph, "request-observed", requestSignal(), { timing })
    for await (const _ of outcome.stream!) {
      // drained
    }
    const ended = performance.now()
    expect(seen.filter((entry) => entry.startsWith("lease")).sort()).toEqual(["lease encoder-a", "lease llm-b"])
    expect(seen.filter((entry) => entry.startsWith("call encoder-a"))).toEqual([
      `call encoder-a ${graph.invocations[0]!.operation} ok`
    ])
    // The time inside executors is counted while a call runs, and stops with the last one.
    const inside = timing.executors.busyMs(ended)
    expect(inside).toBeGreaterThan(0)
    expect(inside).toBeLessThanOrEqual(ended - began)
    expect(timing.executors.busyMs(ended + 1_000)).toBe(inside)
    expect(seen.filter((entry) => !entry.startsWith("call encoder-a") && !entry.startsWith("lease"))).toEqual([
      "first llm-b",
      "next llm-b",
      `call llm-b ${graph.invocations[1]!.operation} ok`
    ])
  })

  it("carries an LLM stream that breaks off on from a fresh run, told the tokens already given, as one stream", async () => {
    for (const encoder of encoders) encoder.handle = (request, response) => answerJson(response, embedded(request.body))
    const tokenChunk = (id: string, content: string, tokens: Array<number>) =>
      `data: ${JSON.stringify({ ...chunk(content), id, cornserve_token_ids: tokens })}\n\n`
    llm.handle = (request, response) => {
      const body = request.body as { cornserve_continuation?: { token_ids: Array<number> } }
      response.writeHead(200, { "content-type": "text/event-stream" })
      if (body.cornserve_continuation === undefined) {
        // Two tokens, then the executor dies.
        response.write(tokenChunk("chatcmpl-first", "re", [7]) + tokenChunk("chatcmpl-first", "d", [8]), () =>
          setTimeout(() => response.destroy(), 20)
        )
        return
      }
      response.end(`${tokenChunk("chatcmpl-second", " wine", [9])}data: [DONE]\n\n`)
    }

    const outcome = await dispatch(graph, "request-failover", requestSignal())
    const pieces: Array<{ id: string; text: string; tokens: unknown }> = []
    for await (const piece of outcome.stream!) {
      const typed = piece as ReturnType<typeof chunk> & { cornserve_token_ids?: unknown }
      pieces.push({ id: typed.id, text: typed.choices[0]!.delta.content, tokens: typed.cornserve_token_ids })
    }

    expect(pieces.map((piece) => piece.text).join("")).toBe("red wine")
    // One completion id throughout; the token ids stay between the dispatcher and its executors.
    expect(new Set(pieces.map((piece) => piece.id))).toEqual(new Set(["chatcmpl-first"]))
    expect(pieces.every((piece) => piece.tokens === undefined)).toBe(true)
    expect(llm.received).toHaveLength(2)
    expect(llm.received[0]!.body).toMatchObject({ cornserve_token_ids: true })
    expect(llm.received[1]!.body).toMatchObject({ cornserve_continuation: { token_ids: [7, 8] } })
    // The fresh run embedded the image again, under a fresh id, and the continuation reads that one.
    const embedIds = encoders
      .flatMap((encoder) => encoder.received)
      .map((request) => (request.body as { items: Array<{ id: string }> }).items[0]!.id)
    const llmIds = llm.received.map(
      (request) => (request.body as { cornserve_embeddings: Array<{ id: string }> }).cornserve_embeddings[0]!.id
    )
    expect(embedIds).toHaveLength(2)
    expect(embedIds[1]).not.toBe(embedIds[0])
    expect(llmIds).toEqual(embedIds)
  })

  it("does not carry on a stream that failed for its input", async () => {
    for (const encoder of encoders) encoder.handle = (request, response) => answerJson(response, embedded(request.body))
    llm.handle = (_, response) => {
      response.writeHead(200, { "content-type": "text/event-stream" })
      response.end(
        `data: ${JSON.stringify(chunk("re"))}\n\ndata: ${JSON.stringify({ error: { code: "ContextLengthExceeded", message: "too long" } })}\n\n`
      )
    }
    const outcome = await dispatch(graph, "request-no-failover", requestSignal())
    await expect(
      (async () => {
        for await (const _ of outcome.stream!) {
          // read until it fails
        }
      })()
    ).rejects.toMatchObject({ _tag: "TaskInputRejected" })
    expect(llm.received).toHaveLength(1)
  })

  describe("releases every executor lease", () => {
    /** Calls in flight the task managers count, by task. */
    const outstanding = async () => {
      const managers = await runtime.runPromise(TaskManagers)
      return Object.fromEntries(
        ["encoder-a", "llm-b"].map((taskId) => [
          taskId,
          managers
            .get(taskId)!
            .executors()
            .reduce((sum, executor) => sum + executor.outstanding, 0)
        ])
      )
    }
    const none = { "encoder-a": 0, "llm-b": 0 }
    /** Until every executor is back in rotation (a refusal as unavailable takes one out until its health line). */
    const allHealthy = async () => {
      const managers = await runtime.runPromise(TaskManagers)
      while (
        !["encoder-a", "llm-b"].every((id) =>
          managers
            .get(id)!
            .executors()
            .every((e) => e.healthy)
        )
      )
        await new Promise((resolve) => setTimeout(resolve, 20))
    }
    afterEach(allHealthy)

    /** The LLM answers with its stream's head at once and its chunks only when `finish` is called. */
    const heldStream = () => {
      let finish: () => void = () => undefined
      const arrived = new Promise<void>((resolve) => {
        llm.handle = (_, response) => {
          response.writeHead(200, { "content-type": "text/event-stream" })
          response.write(`data: ${JSON.stringify(chunk("re"))}\n\n`)
          finish = () => response.end(`data: ${JSON.stringify(chunk("d"))}\n\ndata: [DONE]\n\n`)
          resolve()
        }
      })
      return { arrived, finish: () => finish() }
    }

    it("when the stream is read to its end", async () => {
      for (const encoder of encoders)
        encoder.handle = (request, response) => answerJson(response, embedded(request.body))
      llm.handle = (_, response) => streamChat(response)
      const outcome = await dispatch(graph, "lease-ok", requestSignal())
      for await (const _ of outcome.stream!) {
        // drained
      }
      expect(await outstanding()).toEqual(none)
    })

    it("when one invocation fails after another's stream has begun", async () => {
      const stream = heldStream()
      for (const encoder of encoders)
        encoder.handle = (_, response) => void stream.arrived.then(() => refuse(response, 400, "MediaError", "bad"))
      await expect(dispatch(graph, "lease-branch", requestSignal())).rejects.toMatchObject({
        _tag: "TaskInputRejected"
      })
      expect(await outstanding()).toEqual(none)
    })

    it("when the executor fails on its own", async () => {
      for (const encoder of encoders)
        encoder.handle = (request, response) => answerJson(response, embedded(request.body))
      llm.handle = (_, response) => refuse(response, 500, "ExecutorFailed", "worker 0 failed")
      await expect(dispatch(graph, "lease-executor", requestSignal())).rejects.toMatchObject({
        _tag: "DispatchFailed"
      })
      expect(await outstanding()).toEqual(none)
    })

    it("when one task has no executor to lease and the request is cancelled while it waits", async () => {
      const managers = await runtime.runPromise(TaskManagers)
      for (const encoder of encoders) encoder.health = 503
      while (
        managers
          .get("encoder-a")!
          .executors()
          .some((executor) => executor.healthy)
      )
        await new Promise((resolve) => setTimeout(resolve, 20))
      llm.handle = () => undefined
      const request = new AbortController()
      const outcome = dispatch(graph, "lease-none", request.signal)
      await new Promise((resolve) => setTimeout(resolve, 150))
      // The LLM's lease was taken; the encoder's is still being waited for.
      expect((await outstanding())["llm-b"]).toBe(1)
      request.abort()
      await expect(outcome).rejects.toBeDefined()
      expect(await outstanding()).toEqual(none)
      expect(llm.received).toHaveLength(0)
      for (const encoder of encoders) encoder.health = 200
    })

    it("when the request is cancelled after the stream began and nobody reads it", async () => {
      const stream = heldStream()
      for (const encoder of encoders)
        encoder.handle = (request, response) => answerJson(response, embedded(request.body))
      const request = new AbortController()
      const outcome = await dispatch(graph, "lease-unread", request.signal)
      await stream.arrived
      expect((await outstanding())["llm-b"]).toBe(1)
      request.abort()
      expect(await outstanding()).toEqual(none)
      expect(outcome.stream).toBeDefined()
    })

    it("when the reader stops early", async () => {
      const stream = heldStream()
      for (const encoder of encoders)
        encoder.handle = (request, response) => answerJson(response, embedded(request.body))
      const outcome = await dispatch(graph, "lease-break", requestSignal())
      for await (const _ of outcome.stream!) break
      stream.finish()
      expect(await outstanding()).toEqual(none)
    })

    describe("with a call that answers and goes on (a thinker streaming to a talker)", () => {
      const thinkAndTalk = graphOf(
        {
          taskId: "encoder-a",
          kind: "llm",
          operation: "hidden-states",
          config: { model: "m" },
          input: {
            messages: [{ role: "user", content: "hi" }],
            embeddingSource: "hidden_states",
            embeddingGenerate: "stream"
          },
          output: { embeddings: forward("states"), transcript: { $dataForward: "text", dataType: "string" } },
          streams: false
        },
        {
          taskId: "llm-b",
          kind: "llm",
          operation: "talk",
          config: { model: "m" },
          input: {
            embeddings: forward("states"),
            transcript: { $dataForward: "text", dataType: "string" },
            trailing: true
          },
          output: {},
          streams: true
        }
      )
      const thinkerHead = { id: "x", source: "hidden_states", dtype: "float32", shape: [3, 64] }
      /** The thinker's head at once; `end` then writes its last line (or an error) and ends its answer. */
      const thinking = () => {
        let end: (line: unknown) => void = () => undefined
        for (const encoder of encoders)
          encoder.handle = (_, response) => {
            response.writeHead(200, { "content-type": "application/x-ndjson" })
            response.write(`${JSON.stringify(thinkerHead)}\n`)
            end = (line) => response.end(`${JSON.stringify(line)}\n`)
          }
        return { end: (line: unknown) => end(line) }
      }
      const frame = `${JSON.stringify({ frame: [1, 2] })}\n`

      it("answers its output at its first line, and the request fails when it fails later", async () => {
        const thinker = thinking()
        llm.handle = (_, response) => {
          response.writeHead(200, { "content-type": "application/x-ndjson" })
          response.write(frame)
        }
        const outcome = await dispatch(thinkAndTalk, "goes-on-fails", requestSignal())
        expect(outcome.outputs[0]).toMatchObject({ shape: [3, 64], dtype: "float32" })
        const reader = outcome.stream![Symbol.asyncIterator]()
        expect((await reader.next()).value).toEqual({ frame: [1, 2] })
        expect((await outstanding())["encoder-a"]).toBe(1)
        thinker.end({ error: { code: "ExecutorFailed", message: "worker 0 failed" } })
        await expect(reader.next()).rejects.toMatchObject({
          _tag: "DispatchFailed",
          message: "task encoder-a: ExecutorFailed: worker 0 failed"
        })
        await expect(llm.received[0]!.abandoned).resolves.toBe(true)
        expect(await outstanding()).toEqual(none)
      })

      it("holds its lease until its work ends, and cuts it short when the last stream ends first", async () => {
        const thinker = thinking()
        llm.handle = (_, response) => {
          response.writeHead(200, { "content-type": "application/x-ndjson" })
          response.write(frame)
          void thinkerDone.then(() =>
            response.end(`${JSON.stringify({ done: true, frames: 1, finishReason: "length", frameRate: 12.5 })}\n`)
          )
        }
        let finishTalk: () => void = () => undefined
        const thinkerDone = new Promise<void>((resolve) => (finishTalk = resolve))
        const whole = await dispatch(thinkAndTalk, "goes-on-ends", requestSignal())
        thinker.end({ done: true, completion: { text: "hi", token_ids: [1], finish_reason: "stop" } })
        await new Promise((resolve) => setTimeout(resolve, 50))
        expect((await outstanding())["encoder-a"]).toBe(0)
        finishTalk()
        const items: Array<unknown> = []
        for await (const item of whole.stream!) items.push(item)
        expect(items).toEqual([{ frame: [1, 2] }])
        expect(await outstanding()).toEqual(none)

        // A talker that ends first: the thinker still at work is cancelled, and nothing fails.
        thinking()
        llm.handle = (_, response) => {
          response.writeHead(200, { "content-type": "application/x-ndjson" })
          response.end(
            `${frame}${JSON.stringify({ done: true, frames: 1, finishReason: "length", frameRate: 12.5 })}\n`
          )
        }
        const short = await dispatch(thinkAndTalk, "goes-on-cut", requestSignal())
        for await (const _ of short.stream!) {
          // drained
        }
        const thinkerCall = encoders.flatMap((encoder) => encoder.received).at(-1)!
        await expect(thinkerCall.abandoned).resolves.toBe(true)
        expect(await outstanding()).toEqual(none)
      })
    })

    it("when the stream breaks off mid-way", async () => {
      for (const encoder of encoders)
        encoder.handle = (request, response) => answerJson(response, embedded(request.body))
      llm.handle = (_, response) => {
        response.writeHead(200, { "content-type": "text/event-stream" })
        response.write(`data: ${JSON.stringify(chunk("re"))}\n\n`, () => setTimeout(() => response.destroy(), 20))
      }
      const outcome = await dispatch(graph, "lease-broken", requestSignal())
      await expect(
        (async () => {
          for await (const _ of outcome.stream!) {
            // read until it breaks
          }
        })()
      ).rejects.toBeDefined()
      expect(await outstanding()).toEqual(none)
    })

    it("when an executor is unavailable and the graph runs again", async () => {
      for (const encoder of encoders)
        encoder.handle = (request, response) => answerJson(response, embedded(request.body))
      let tries = 0
      llm.handle = (_, response) => {
        tries++
        if (tries === 1) return refuse(response, 503, "EngineUnavailable", "full")
        streamChat(response)
      }
      const outcome = await dispatch(graph, "lease-retry", requestSignal())
      for await (const _ of outcome.stream!) {
        // drained
      }
      expect(await outstanding()).toEqual(none)
    })
  })

  it("refuses a graph one of whose tasks is full before any call starts, and does not run it again", async () => {
    const managers = await runtime.runPromise(TaskManagers)
    const llmTask = managers.get("llm-b")!
    const held = []
    // The default bound: 64 calls per executor in rotation.
    for (let index = 0; index < 64; index++) held.push(await llmTask.lease({}))
    for (const encoder of encoders) encoder.handle = (request, response) => answerJson(response, embedded(request.body))
    llm.handle = (_, response) => streamChat(response)

    await expect(dispatch(graph, "request-full", requestSignal())).rejects.toMatchObject({
      _tag: "TaskUnavailable",
      message: "task llm-b is full: 64 calls in flight, its limit with 1 executor(s) in rotation is 64"
    })
    expect(encoders.flatMap((encoder) => encoder.received)).toHaveLength(0)
    expect(llm.received).toHaveLength(0)
    for (const lease of held) lease.release("unused")
    const encoderTask = managers.get("encoder-a")!
    expect(encoderTask.executors().map((executor) => executor.outstanding)).toEqual([0, 0])
  })

  it("refuses a graph whose task is not deployed as TaskUnavailable", async () => {
    await expect(dispatch(graphOf(llmCall("llm-missing", [])), "request-6", requestSignal())).rejects.toMatchObject({
      _tag: "TaskUnavailable"
    })
  })
})
