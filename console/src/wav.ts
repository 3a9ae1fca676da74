/**
 * An app's streamed audio (`{ audio: base64 PCM16 little-endian mono, sampleRate }` chunks, as the
 * SDK's AudioChunk) gathered into one WAV file that an <audio> element plays.
 */
export const base64Bytes = (base64: string): Uint8Array => {
  const binary = atob(base64)
  const bytes = new Uint8Array(binary.length)
  for (let index = 0; index < binary.length; index++) bytes[index] = binary.charCodeAt(index)
  return bytes
}

export const bytesBase64 = (bytes: Uint8Array): string => {
  let binary = ""
  // In slices: String.fromCharCode takes its arguments on the stack.
  for (let offset = 0; offset < bytes.length; offset += 0x8000)
    binary += String.fromCharCode(...bytes.subarray(offset, offset + 0x8000))
  return btoa(binary)
}

/** A mono 16-bit WAV file of the PCM bytes given, in order. */
export const wavOf = (chunks: ReadonlyArray<Uint8Array>, sampleRate: number): Blob => {
  const dataBytes = chunks.reduce((sum, chunk) => sum + (chunk.byteLength & ~1), 0)
  const header = new DataView(new ArrayBuffer(44))
  const ascii = (offset: number, text: string) => {
    for (let index = 0; index < text.length; index++) header.setUint8(offset + index, text.charCodeAt(index))
  }
  ascii(0, "RIFF")
  header.setUint32(4, 36 + dataBytes, true)
  ascii(8, "WAVE")
  ascii(12, "fmt ")
  header.setUint32(16, 16, true)
  header.setUint16(20, 1, true)
  header.setUint16(22, 1, true)
  header.setUint32(24, sampleRate, true)
  header.setUint32(28, sampleRate * 2, true)
  header.setUint16(32, 2, true)
  header.setUint16(34, 16, true)
  ascii(36, "data")
  header.setUint32(40, dataBytes, true)
  // A chunk of an odd length would shift every later sample by a byte: its last byte is dropped.
  const parts = chunks.map((chunk) => chunk.subarray(0, chunk.byteLength & ~1) as Uint8Array<ArrayBuffer>)
  return new Blob([header.buffer, ...parts], { type: "audio/wav" })
}
