import { spawn } from "node:child_process"
import { mkdtemp, readFile, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { videoTools } from "../../src/executors/common/media/VideoContainer.js"

/** Video files the tests make with the same ffmpeg the platform decodes with. */

export type Rgb = readonly [number, number, number]

/** Frames of one solid colour each, as ffmpeg's rawvideo rgb24 input. */
export const solidFrames = (colours: ReadonlyArray<Rgb>, width: number, height: number): Buffer => {
  const raw = Buffer.alloc(colours.length * width * height * 3)
  colours.forEach((colour, frame) => {
    for (let pixel = 0; pixel < width * height; pixel++) raw.set(colour, (frame * width * height + pixel) * 3)
  })
  return raw
}

/** The ffmpeg arguments that read `solidFrames` from stdin at `fps`. */
export const rawInput = (width: number, height: number, fps: number) => [
  "-f",
  "rawvideo",
  "-pix_fmt",
  "rgb24",
  "-s",
  `${width}x${height}`,
  "-r",
  String(fps),
  "-i",
  "pipe:0"
]

/**
 * ffmpeg's output in `format`, written to a file (so an mp4 or mov is written as a seekable file
 * is, its index at its end) and read back; `stdin` goes to its standard input.
 */
export const ffmpegFile = async (args: ReadonlyArray<string>, format: string, stdin?: Buffer): Promise<Buffer> => {
  const directory = await mkdtemp(join(tmpdir(), "cornserve-test-video-"))
  try {
    const path = join(directory, "out")
    await new Promise<void>((resolve, reject) => {
      const child = spawn(videoTools().ffmpeg, ["-v", "error", ...args, "-f", format, path], {
        stdio: ["pipe", "ignore", "pipe"]
      })
      let stderr = ""
      child.stderr.on("data", (chunk: Buffer) => {
        stderr += chunk.toString()
      })
      child.once("error", reject)
      // ffmpeg may exit without reading its stdin (an input from lavfi, or a refused argument);
      // the write's EPIPE then says nothing its exit code does not.
      child.stdin.on("error", () => undefined)
      child.once("close", (code) =>
        code === 0 ? resolve() : reject(new Error(`ffmpeg exited with ${code}: ${stderr}`))
      )
      child.stdin.end(stdin ?? Buffer.alloc(0))
    })
    return await readFile(path)
  } finally {
    await rm(directory, { recursive: true, force: true })
  }
}
