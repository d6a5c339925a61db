// /checksums, the manifest that makes a finished results file verifiable.
#pragma once
#include <string>

namespace hcp {

// Writes /checksums into the closed results file `tmp` (shown as `shown` in messages): one line per
// numeric dataset ("/path hex") and per numeric attribute of an object under /summary
// ("/path@name hex"); hex = checksum_values() of the values as doubles in C order.
void write_manifest(const std::string& tmp, const std::string& shown);

}  // namespace hcp
