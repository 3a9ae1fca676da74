/**
 * WAV files of PCM16 mono samples: the 44-byte RIFF/WAVE header, and whole files.
 */

/** 0xFFFFFFFF in a size field: a stream whose length is not known while it is written. */
const unknownLength = 0xffff_ffff

/**
 * The 44-byte RIFF/WAVE header of PCM16 mono at `sampleRate` holding `dataBytes` of samples; left
 * out, the sizes say "unknown", as OpenAI's streamed wav does (players read such a file to its end).
 */
export const wavHeader = (sampleRate: number, dataBytes?: number): Buffer => {
  const header = Buffer.alloc(44)
  header.write("RIFF", 0, "ascii")
  header.writeUInt32LE(dataBytes === undefined ? unknownLength : 36 + dataBytes, 4)
  header.write("WAVE", 8, "ascii")
  header.write("fmt ", 12, "ascii")
  header.writeUInt32LE(16, 16)
  header.writeUInt16LE(1, 20)
  header.writeUInt16LE(1, 22)
  header.writeUInt32LE(sampleRate, 24)
  header.writeUInt32LE(sampleRate * 2, 28)
  header.writeUInt16LE(2, 32)
  header.writeUInt16LE(16, 34)
  header.write("data", 36, "ascii")
  header.writeUInt32LE(dataBytes ?? unknownLength, 40)
  return header
}

/** A WAV file of mono PCM16 samples. */
export const wavFile = (pcm: ReadonlyArray<Int16Array>, sampleRate: number): Buffer => {
  const samples = pcm.reduce((sum, chunk) => sum + chunk.length, 0)
  return Buffer.concat([
    wavHeader(sampleRate, samples * 2),
    ...pcm.map((chunk) => Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength))
  ])
}
