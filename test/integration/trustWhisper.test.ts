import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { internalSecretOf } from "../../src/contracts/Credentials.js"
import { credentialHeaders } from "../../src/control/executor-calls/ExecutorHttp.js"
import { wavFile } from "../../src/executors/common/media/Wav.js"
import { Random } from "../../src/models/Random.js"
import {
  adminHeaders,
  type RunningPlatform,
  removeStateDir,
  repoRoot,
  runCli,
  startPlatform
} from "../support/platform.js"

/**
 * What a transcription request may ask of Whisper's windows, through the real binary and
 * examples/transcribe.ts: windows that would not move on (a stride of half the chunk), or that are
 * too short, are a 400 naming the fields on OpenAI's multipart route, as `curl -F` sends them,
 * and on the executor's own route, and the transcriptions after them answer; a form's fields named
 * `__proto__`, `constructor` or `prototype` are refused as any unknown field is.
 */

const clusterToken = "trust-whisper-cluster-token"

/** Tones over noise, 16 kHz 16-bit WAV. */
const clip = (seconds: number, seed: number): Buffer => {
  const random = new Random(seed)
  return wavFile(
    [
      Int16Array.from(random.normals(Math.round(seconds * 16000), 0.05), (v, i) =>
        Math.round(
          32767 * Math.max(-1, Math.min(1, v + 0.4 * Math.sin((2 * Math.PI * (200 + 300 * seed) * i) / 16000)))
        )
      )
    ],
    16000
  )
}

interface Refusal {
  readonly error: { readonly message: string; readonly param?: string | null; readonly code?: string | null }
}

describe("a transcription request's windows and form fields", () => {
  let platform: RunningPlatform
  const wav = clip(2, 1)

  beforeAll(async () => {
    platform = await startPlatform({ args: ["--devices", "cpu:0"], env: { CORNSERVE_CLUSTER_TOKEN: clusterToken } })
    const registered = await runCli(["app", "register", join(repoRoot, "examples", "transcribe.ts")], {
      CORNSERVE_GATEWAY_URL: platform.url
    })
    expect(registered.code, registered.stderr).toBe(0)
  }, 240_000)

  afterAll(async () => {
    await platform?.stop()
    if (platform !== undefined) await removeStateDir(platform.stateDir)
  })

  /** A form as `curl -F` posts it to OpenAI's route: the audio as `file`, the rest as text fields. */
  const transcribe = (fields: ReadonlyArray<readonly [string, string]>, audio: Buffer = wav) => {
    const form = new FormData()
    form.append("file", new Blob([audio], { type: "audio/wav" }), "clip.wav")
    for (const [name, value] of fields) form.append(name, value)
    return fetch(`${platform.url}/app/transcribe/v1/audio/transcriptions`, {
      method: "POST",
      body: form,
      // A request that hangs fails the test rather than the run.
      signal: AbortSignal.timeout(90_000)
    })
  }

  const ordinaryTranscription = async () => {
    const response = await transcribe([["response_format", "verbose_json"]])
    expect(response.status).toBe(200)
    const answer = (await response.json()) as { text: string; duration: number }
    expect(answer.duration).toBeCloseTo(2, 5)
    return answer.text
  }

  it("refuses windows that would not move on, or too short, naming the fields; the next transcriptions answer", async () => {
    for (const [fields, named] of [
      [
        [
          ["chunk_length_s", "1"],
          ["stride_length_s", "0.5"]
        ],
        /stride_length_s: 0\.5 is too long for chunk_length_s 1/
      ],
      [
        [
          ["chunk_length_s", "2"],
          ["stride_length_s", "0.9"]
        ],
        /stride_length_s: 0\.9 is too long for chunk_length_s 2/
      ],
      [
        [
          ["chunk_length_s", "30"],
          ["stride_length_s", "15"]
        ],
        /stride_length_s: 15 is too long for chunk_length_s 30/
      ],
      [[["stride_length_s", "12"]], /stride_length_s: 12 is too long for the default chunk_length_s of 30/],
      [[["chunk_length_s", "0.01"]], /chunk_length_s: must be from 1 to 30 seconds/],
      [[["chunk_length_s", "45"]], /chunk_length_s: must be from 1 to 30 seconds/],
      [[["stride_length_s", "-1"]], /stride_length_s: must be 0 seconds or more/]
    ] as const) {
      const response = await transcribe(fields)
      const label = JSON.stringify(fields)
      expect(response.status, label).toBe(400)
      expect(((await response.json()) as Refusal).error.message, label).toMatch(named)
    }
    const texts = [await ordinaryTranscription(), await ordinaryTranscription(), await ordinaryTranscription()]
    expect(new Set(texts).size).toBe(1)
    // The densest windows allowed are taken: each a quarter of a window after the one before.
    const dense = await transcribe([
      ["chunk_length_s", "1"],
      ["stride_length_s", "0.375"]
    ])
    expect(dense.status).toBe(200)
  }, 300_000)

  it("refuses the same windows on the executor's own route, and a clip cut in more windows than a request may hold", async () => {
    const { tasks } = (await (await fetch(`${platform.url}/tasks/list`, { headers: adminHeaders() })).json()) as {
      tasks: Array<{ readonly name: string; readonly executors: ReadonlyArray<{ readonly url: string | null }> }>
    }
    const executor = tasks.find((task) => task.name.startsWith("speech-recognizer"))!.executors[0]!.url!
    const direct = (body: object) =>
      fetch(`${executor}/transcriptions`, {
        method: "POST",
        headers: { "content-type": "application/json", ...credentialHeaders(internalSecretOf(clusterToken)) },
        body: JSON.stringify({ url: `data:audio/wav;base64,${wav.toString("base64")}`, ...body }),
        signal: AbortSignal.timeout(90_000)
      })
    const halfway = await direct({ chunkSeconds: 1, strideSeconds: 0.5 })
    expect(halfway.status).toBe(400)
    expect(((await halfway.json()) as { error: { code: string; message: string } }).error).toEqual({
      code: "BadRequest",
      message: expect.stringMatching(/^stride_length_s: 0\.5 is too long for chunk_length_s 1: .* at most 0\.375$/)
    })
    // 40 s in 1 s windows a quarter apart: 157 windows of 30 s of features, more than the 77 of
    // the longest clip the executor takes (600 s) in 30 s windows.
    const many = await fetch(`${executor}/transcriptions`, {
      method: "POST",
      headers: { "content-type": "application/json", ...credentialHeaders(internalSecretOf(clusterToken)) },
      body: JSON.stringify({
        url: `data:audio/wav;base64,${clip(40, 2).toString("base64")}`,
        chunkSeconds: 1,
        strideSeconds: 0.375
      }),
      signal: AbortSignal.timeout(90_000)
    })
    expect(many.status).toBe(400)
    expect(((await many.json()) as { error: { message: string } }).error.message).toMatch(
      /^chunk_length_s 1 and stride_length_s 0\.375 cut this 40\.0 s clip in 157 windows, and a request may have at most 77/
    )
    const through = await direct({})
    expect(through.status).toBe(200)
    expect(await ordinaryTranscription()).toEqual(expect.any(String))
  }, 300_000)

  it("refuses form fields named __proto__, constructor and prototype as any unknown field", async () => {
    const refusal = async (name: string) => {
      const response = await transcribe([[name, "x"]])
      expect(response.status, name).toBe(400)
      return ((await response.json()) as Refusal).error
    }
    expect(await refusal("colour")).toMatchObject({
      message: "`colour` is not a parameter of transcriptions",
      param: "colour",
      code: "unsupported_parameter"
    })
    for (const name of ["__proto__", "constructor", "prototype"]) {
      expect(await refusal(name)).toMatchObject({
        message: `\`${name}\` is not a parameter of transcriptions`,
        param: name,
        code: "unsupported_parameter"
      })
    }
    expect(await ordinaryTranscription()).toEqual(expect.any(String))
  }, 120_000)
})
