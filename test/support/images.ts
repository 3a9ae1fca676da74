import sharp from "sharp"

/** An 8×8 PNG of one colour, base64 (the colour apps' tests name it back). */
export const solidPngBase64 = async (r: number, g: number, b: number): Promise<string> =>
  (
    await sharp({ create: { width: 8, height: 8, channels: 3, background: { r, g, b } } })
      .png()
      .toBuffer()
  ).toString("base64")
