// PEM files for gRPC's TLS credentials; see tls_files.h.
#include "common/tls_files.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace zenflow {
namespace {

// A PEM file of certificates or a key is a few KiB; anything this large is
// the wrong file.
constexpr off_t kMaxPemBytes = 1 << 20;

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

// Refuses to ask for a passphrase (OpenSSL's default would read the
// terminal): a protected key fails to load.
int NoPassphrase(char*, int, int, void*) { return -1; }

// OpenSSL's newest queued error as text; clears the queue.
std::string SslError() {
  const unsigned long e = ERR_peek_last_error();
  std::string text = "unknown OpenSSL error";
  if (e != 0) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    text = buf;
  }
  ERR_clear_error();
  return text;
}

// Whether OpenSSL's newest error says the input held no (further) PEM block
// of the kind asked for.
bool NoMorePem() {
  const unsigned long e = ERR_peek_last_error();
  return ERR_GET_LIB(e) == ERR_LIB_PEM && ERR_GET_REASON(e) == PEM_R_NO_START_LINE;
}

// Whether `text` has a line "-----BEGIN <anything>PRIVATE KEY-----" (PKCS#8,
// RSA, EC, encrypted...). OpenSSL 3's key decoders do not tell "no key
// block" from "a block it cannot decode".
bool HasPrivateKeyBlock(const std::string& text) {
  static constexpr absl::string_view kBegin = "-----BEGIN ";
  static constexpr absl::string_view kEnd = "PRIVATE KEY-----";
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripTrailingAsciiWhitespace(line);
    if (absl::StartsWith(line, kBegin) && absl::EndsWith(line, kEnd)) return true;
  }
  return false;
}

std::string Where(const std::string& name, const std::string& path) {
  return absl::StrCat(name, " ", path);
}

absl::StatusOr<std::string> ReadFile(const std::string& name, const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(name, path), ": cannot read it: ", std::strerror(errno)));
  }
  struct stat st;
  std::string text;
  std::string error;
  if (fstat(fd, &st) != 0) {
    error = std::strerror(errno);
  } else if (S_ISDIR(st.st_mode)) {
    error = "it is a directory";
  } else if (st.st_size > kMaxPemBytes) {
    error = absl::StrCat("it is ", st.st_size, " bytes, too large for a PEM file");
  } else {
    char buf[4096];
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        error = absl::StrCat("cannot read it: ", std::strerror(errno));
        break;
      }
      if (n == 0) break;
      text.append(buf, static_cast<size_t>(n));
      if (static_cast<off_t>(text.size()) > kMaxPemBytes) {
        error = "it is too large for a PEM file";
        break;
      }
    }
  }
  close(fd);
  if (!error.empty()) return absl::InvalidArgumentError(absl::StrCat(Where(name, path), ": ", error));
  return text;
}

// The first of the certificates in `pem` (all of which must parse).
absl::StatusOr<X509Ptr> ParseCertificates(const std::string& pem, const std::string& name,
                                          const std::string& path) {
  ERR_clear_error();
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (bio == nullptr) return absl::ResourceExhaustedError("BIO_new_mem_buf failed");
  X509Ptr first;
  for (int n = 0;; ++n) {
    X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr));
    if (cert == nullptr) {
      if (NoMorePem()) {
        ERR_clear_error();
        if (n > 0) return first;
        return absl::InvalidArgumentError(
            absl::StrCat(Where(name, path),
                         ": no PEM certificate in it (no -----BEGIN CERTIFICATE----- block)"));
      }
      return absl::InvalidArgumentError(absl::StrCat(Where(name, path), ": certificate ", n + 1,
                                                     " in it is not valid: ", SslError()));
    }
    if (first == nullptr) first = std::move(cert);
  }
}

absl::StatusOr<PkeyPtr> ParsePrivateKey(const std::string& pem, const std::string& name,
                                        const std::string& path) {
  if (!HasPrivateKeyBlock(pem)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(name, path), ": no PEM private key in it (no -----BEGIN ... PRIVATE KEY----- block)"));
  }
  ERR_clear_error();
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (bio == nullptr) return absl::ResourceExhaustedError("BIO_new_mem_buf failed");
  PkeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr));
  if (key != nullptr) return key;
  const bool encrypted = pem.find("ENCRYPTED") != std::string::npos;
  return absl::InvalidArgumentError(absl::StrCat(
      Where(name, path), ": the private key in it cannot be loaded",
      encrypted ? " (it is passphrase-protected; give the key unencrypted, readable only by "
                  "its owner)"
                : "",
      ": ", SslError()));
}

}  // namespace

absl::StatusOr<TlsPem> ReadTlsFiles(const TlsPaths& paths, const TlsNames& names) {
  if (paths.cert.empty() != paths.key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        names.cert, " and ", names.key, " go together: give both (or neither); only ",
        paths.cert.empty() ? names.key : names.cert, " is set"));
  }
  TlsPem pem;
  if (!paths.cert.empty()) {
    absl::StatusOr<std::string> cert = ReadFile(names.cert, paths.cert);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<X509Ptr> leaf = ParseCertificates(*cert, names.cert, paths.cert);
    if (!leaf.ok()) return leaf.status();
    absl::StatusOr<std::string> key = ReadFile(names.key, paths.key);
    if (!key.ok()) return key.status();
    absl::StatusOr<PkeyPtr> pkey = ParsePrivateKey(*key, names.key, paths.key);
    if (!pkey.ok()) return pkey.status();
    ERR_clear_error();
    if (X509_check_private_key(leaf->get(), pkey->get()) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(absl::StrCat(Where(names.key, paths.key),
                                                     " does not belong to the certificate in ",
                                                     Where(names.cert, paths.cert)));
    }
    pem.cert = *std::move(cert);
    pem.key = *std::move(key);
  }
  if (!paths.ca.empty()) {
    absl::StatusOr<std::string> ca = ReadFile(names.ca, paths.ca);
    if (!ca.ok()) return ca.status();
    absl::StatusOr<X509Ptr> first = ParseCertificates(*ca, names.ca, paths.ca);
    if (!first.ok()) return first.status();
    pem.ca = *std::move(ca);
  }
  return pem;
}

}  // namespace zenflow
