import { describe, expect, it } from "vitest"
import { maxParts, multipartBoundary, parseMultipart } from "../../../src/control/gateway/Multipart.js"
import { prepareOpenAiRequest } from "../../../src/control/gateway/OpenAiApi.js"
import { subRip, transcriptionOfForm, webVtt } from "../../../src/control/gateway/TranscriptionsApi.js"

/**
 * The pieces of OpenAI's transcriptions route: multipart bodies read as the browsers' and OpenAI's
 * clients' FormData writes them, an upload as the JSON request an app takes, and subtitles.
 */

/** A body as undici's FormData serializes it, with its content type. */
const encoded = async (form: FormData) => {
  const request = new Request("http://localhost/", { method: "POST", body: form })
  return { contentType: request.headers.get("content-type")!, body: Buffer.from(await request.arrayBuffer()) }
}

describe("multipart/form-data", () => {
  it("reads FormData's fields and files, bytes exact", async () => {
    const bytes = Buffer.from(Array.from({ length: 3000 }, (_, i) => (i * 37) % 256))
    const form = new FormData()
    form.append("model", "whisper")
    form.append("file", new Blob([bytes], { type: "audio/wav" }), "clip one.wav")
    form.append("timestamp_granularities[]", "segment")
    form.append("note", "line one\r\n--not a boundary\r\nline three")
    const { contentType, body } = await encoded(form)
    const boundary = multipartBoundary(contentType)
    expect(typeof boundary).toBe("string")
    const parts = parseMultipart(body, boundary as string)
    if ("problem" in parts) throw new Error(parts.problem)
    expect(parts.map((part) => part.name)).toEqual(["model", "file", "timestamp_granularities[]", "note"])
    expect(parts[1]!.filename).toBe("clip one.wav")
    expect(parts[1]!.contentType).toBe("audio/wav")
    expect(Buffer.compare(parts[1]!.data, bytes)).toBe(0)
    expect(parts[3]!.data.toString()).toBe("line one\r\n--not a boundary\r\nline three")
  })

  it("refuses what is not a form, saying why", () => {
    expect(multipartBoundary("application/json")).toEqual({ problem: "not multipart/form-data" })
    expect(multipartBoundary("multipart/form-data")).toEqual({ problem: "multipart/form-data without a boundary" })
    expect(multipartBoundary(`multipart/form-data; boundary=${"x".repeat(71)}`)).toHaveProperty("problem")
    expect(multipartBoundary('multipart/form-data; boundary="a b"')).toBe("a b")
    const problem = (body: string) => (parseMultipart(Buffer.from(body), "b") as { problem: string }).problem
    expect(problem("no boundary here")).toMatch(/boundary is not in it/)
    expect(problem("--b\r\ncontent-disposition: form-data; name=x\r\n\r\nvalue")).toMatch(/no closing boundary/)
    expect(problem("--b\r\ncontent-type: text/plain\r\n\r\nvalue\r\n--b--")).toMatch(/content-disposition/)
    expect(problem(`--b\r\n${"x".repeat(9000)}`)).toMatch(/headers do not end/)
    const many = `${Array.from({ length: maxParts + 1 }, (_, i) => `--b\r\ncontent-disposition: form-data; name=f${i}\r\n\r\nv\r\n`).join("")}--b--`
    expect(problem(many)).toMatch(/more than 64 parts/)
  })
})

describe("an upload as a transcription request", () => {
  const part = (name: string, value: string, file?: { filename: string; contentType?: string }) => ({
    name,
    data: Buffer.from(value),
    ...(file === undefined ? {} : file)
  })

  it("makes the file a data: URL of its type, numbers numbers, and granularities a list", () => {
    const made = transcriptionOfForm([
      part("file", "RIFF", { filename: "a.mp3" }),
      part("temperature", "0"),
      part("timestamp_granularities[]", "segment"),
      part("language", "de")
    ])
    expect(made).toEqual({
      body: JSON.stringify({
        file: `data:audio/mpeg;base64,${Buffer.from("RIFF").toString("base64")}`,
        temperature: 0,
        language: "de",
        timestamp_granularities: ["segment"]
      })
    })
    const typed = transcriptionOfForm([part("file", "x", { filename: "a.bin", contentType: "audio/ogg" })])
    expect((typed as { body: string }).body).toContain("data:audio/ogg;base64,")
  })

  it("refuses a form without a file, with two, a second file field, or a number that is not one", () => {
    expect(transcriptionOfForm([part("model", "m")])).toMatchObject({ status: 400, param: "file" })
    expect(
      transcriptionOfForm([part("file", "a", { filename: "a.wav" }), part("file", "b", { filename: "b.wav" })])
    ).toMatchObject({ status: 400, param: "file" })
    expect(
      transcriptionOfForm([part("file", "a", { filename: "a.wav" }), part("language", "x", { filename: "l.txt" })])
    ).toMatchObject({ status: 400, param: "language" })
    expect(transcriptionOfForm([part("file", "a", { filename: "a.wav" }), part("temperature", "warm")])).toMatchObject({
      status: 400,
      param: "temperature"
    })
    expect(
      transcriptionOfForm([
        part("file", "a", { filename: "a.wav" }),
        part("chunk_length_s", "10"),
        part("chunk_length_s", "1")
      ])
    ).toMatchObject({ status: 400, param: "chunk_length_s", message: "the form gives `chunk_length_s` twice" })
  })

  it("takes fields named as Object's own properties as fields, which the route refuses as it refuses any unknown one", () => {
    const unknown = (name: string) => {
      const form = transcriptionOfForm([part("file", "a", { filename: "a.wav" }), part(name, "x")])
      expect(form, name).toHaveProperty("body")
      const body = (form as { body: string }).body
      expect(Object.keys(JSON.parse(body) as object), name).toEqual(["file", name])
      return prepareOpenAiRequest("transcriptions", body, [])
    }
    const expected = (name: string) => ({
      refusal: {
        status: 400,
        param: name,
        code: "unsupported_parameter",
        message: `\`${name}\` is not a parameter of transcriptions`
      }
    })
    expect(unknown("colour")).toEqual(expected("colour"))
    for (const name of ["__proto__", "constructor", "prototype", "toString", "hasOwnProperty"]) {
      expect(unknown(name), name).toEqual(expected(name))
    }
  })
})

describe("subtitles", () => {
  const transcription = {
    task: "transcribe" as const,
    language: "en",
    duration: 3725.5,
    text: " Hello there. General",
    segments: [
      { id: 0, start: 0, end: 1.5, text: " Hello there." },
      { id: 1, start: 3723.25, end: null, text: " General" }
    ]
  }

  it("writes SubRip and WebVTT cues, an open end closing at the audio's end", () => {
    expect(subRip(transcription)).toBe(
      "1\n00:00:00,000 --> 00:00:01,500\nHello there.\n\n2\n01:02:03,250 --> 01:02:05,500\nGeneral\n"
    )
    expect(webVtt(transcription)).toBe(
      "WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello there.\n\n01:02:03.250 --> 01:02:05.500\nGeneral\n"
    )
  })
})
